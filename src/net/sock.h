/* POSIX socket helpers for the TCP transport: address parsing, listening,
 * dialing with a timeout, the socket options every connection gets, and
 * reads/writes with a deadline.  The only file that knows socket calls
 * besides tcp.c.  All sockets are non-blocking and close-on-exec; waits are
 * poll() with a deadline; EINTR is retried. */
#ifndef DOWNPOUR_NET_SOCK_H
#define DOWNPOUR_NET_SOCK_H

#include "downpour/status.h"

#include <stddef.h>
#include <sys/socket.h>

typedef struct dp_sockaddr {
    struct sockaddr_storage ss;
    socklen_t len;
} dp_sockaddr;

/* "host:port" or "[v6]:port"; host may be a name.  Port 0 only if allow_zero. */
int dp_sock_resolve(const char *hostport, int allow_zero, dp_sockaddr *out, dp_err *err);
/* "127.0.0.1:4242" of an address, a socket's peer or its local end. */
void dp_sock_addr_str(const dp_sockaddr *a, char *buf, size_t cap);
void dp_sock_peer_str(int fd, char *buf, size_t cap);
int dp_sock_local_port(int fd);

/* TCP_NODELAY, and SO_SNDBUF/SO_RCVBUF when buf_bytes > 0, one call each. */
int dp_sock_tune(int fd, int buf_bytes, const char *what, dp_err *err);
/* Binds (SO_REUSEADDR) and listens; *port_out gets the bound port. */
int dp_sock_listen(const char *hostport, int buf_bytes, int *fd_out, int *port_out, dp_err *err);
/* One connection attempt bounded by timeout_s.  Returns 0, or -1 with errno
 * kept in *errno_out (ECONNREFUSED etc., for the caller's retry policy). */
int dp_sock_dial(const dp_sockaddr *a, int buf_bytes, double timeout_s, int *fd_out,
                 int *errno_out, dp_err *err);

/* Whole-buffer read/write on a non-blocking socket, waiting until deadline
 * (dp_now() seconds).  EOF before len bytes is an error ("closed"). */
int dp_sock_read_full(int fd, void *buf, size_t len, double deadline, dp_err *err);
int dp_sock_write_full(int fd, const void *buf, size_t len, double deadline, dp_err *err);

/* poll() one fd for events, at most timeout_s; returns revents, 0 on timeout,
 * -1 on error. EINTR counts as a timeout slice. */
int dp_sock_wait(int fd, short events, double timeout_s);

#endif

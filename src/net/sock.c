#include "sock.h"

#include "downpour/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int dp_sock_resolve(const char *hostport, int allow_zero, dp_sockaddr *out, dp_err *err)
{
    char host[256];
    const char *colon = hostport ? strrchr(hostport, ':') : NULL;
    if (!colon || colon == hostport)
        return dp_errf(err, "address '%s': expected host:port", hostport ? hostport : "(null)");
    size_t hl = (size_t)(colon - hostport);
    if (hl >= sizeof host)
        return dp_errf(err, "address '%s': host name too long", hostport);
    memcpy(host, hostport, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') { /* [::1]:port */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    long port;
    if (dp_parse_long(colon + 1, allow_zero ? 0 : 1, 65535, &port, "port", err))
        return dp_err_prefix(err, "address '%s'", hostport);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0 || !res)
        return dp_errf(err, "address '%s': cannot resolve host '%s': %s", hostport, host,
                       gai_strerror(rc));
    memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
    out->len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

void dp_sock_addr_str(const dp_sockaddr *a, char *buf, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (a->ss.ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)&a->ss;
        inet_ntop(AF_INET, &s->sin_addr, ip, sizeof ip);
        port = ntohs(s->sin_port);
        snprintf(buf, cap, "%s:%d", ip, port);
    } else if (a->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&a->ss;
        inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof ip);
        port = ntohs(s->sin6_port);
        snprintf(buf, cap, "[%s]:%d", ip, port);
    } else {
        snprintf(buf, cap, "(unknown address family %d)", (int)a->ss.ss_family);
    }
}

void dp_sock_peer_str(int fd, char *buf, size_t cap)
{
    dp_sockaddr a;
    a.len = sizeof a.ss;
    if (getpeername(fd, (struct sockaddr *)&a.ss, &a.len) != 0) {
        snprintf(buf, cap, "(unknown peer: %s)", strerror(errno));
        return;
    }
    dp_sock_addr_str(&a, buf, cap);
}

int dp_sock_local_port(int fd)
{
    dp_sockaddr a;
    a.len = sizeof a.ss;
    if (getsockname(fd, (struct sockaddr *)&a.ss, &a.len) != 0)
        return -1;
    if (a.ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&a.ss)->sin_port);
    if (a.ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&a.ss)->sin6_port);
    return -1;
}

static int set_int(int fd, int level, int opt, int val, const char *optname, const char *what,
                   dp_err *err)
{
    if (setsockopt(fd, level, opt, &val, sizeof val) != 0)
        return dp_errf(err, "%s: setsockopt %s=%d: %s", what, optname, val, strerror(errno));
    return 0;
}

int dp_sock_tune(int fd, int buf_bytes, const char *what, dp_err *err)
{
    if (set_int(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY", what, err))
        return -1;
    if (buf_bytes > 0) {
        if (set_int(fd, SOL_SOCKET, SO_SNDBUF, buf_bytes, "SO_SNDBUF", what, err))
            return -1;
        if (set_int(fd, SOL_SOCKET, SO_RCVBUF, buf_bytes, "SO_RCVBUF", what, err))
            return -1;
    }
    return 0;
}

int dp_sock_listen(const char *hostport, int buf_bytes, int *fd_out, int *port_out, dp_err *err)
{
    dp_sockaddr a;
    if (dp_sock_resolve(hostport, 1, &a, err))
        return -1;
    int fd = socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return dp_errf(err, "listen on %s: socket: %s", hostport, strerror(errno));
    char what[300];
    snprintf(what, sizeof what, "listen on %s", hostport);
    /* Options set on the listener are inherited by accepted sockets; the
     * receive buffer must be set before listen() for window scaling. */
    if (set_int(fd, SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR", what, err) ||
        dp_sock_tune(fd, buf_bytes, what, err))
        goto fail;
    if (bind(fd, (struct sockaddr *)&a.ss, a.len) != 0) {
        dp_errf(err, "cannot bind %s: %s%s", hostport, strerror(errno),
                errno == EADDRINUSE ? " (another process holds this port: pick another port or "
                                      "stop that process)"
                                    : "");
        goto fail;
    }
    if (listen(fd, 128) != 0) {
        dp_errf(err, "listen on %s: %s", hostport, strerror(errno));
        goto fail;
    }
    *fd_out = fd;
    if (port_out)
        *port_out = dp_sock_local_port(fd);
    return 0;
fail:
    close(fd);
    return -1;
}

int dp_sock_wait(int fd, short events, double timeout_s)
{
    struct pollfd p = {fd, events, 0};
    int ms = timeout_s <= 0 ? 0 : (int)(timeout_s * 1000.0 + 0.999);
    int rc = poll(&p, 1, ms);
    if (rc < 0)
        return errno == EINTR ? 0 : -1;
    return rc == 0 ? 0 : p.revents;
}

int dp_sock_dial(const dp_sockaddr *a, int buf_bytes, double timeout_s, int *fd_out,
                 int *errno_out, dp_err *err)
{
    char addr[128];
    dp_sock_addr_str(a, addr, sizeof addr);
    *errno_out = 0;
    int fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *errno_out = errno;
        return dp_errf(err, "connect to %s: socket: %s", addr, strerror(errno));
    }
    char what[160];
    snprintf(what, sizeof what, "connect to %s", addr);
    if (dp_sock_tune(fd, buf_bytes, what, err)) {
        *errno_out = errno;
        close(fd);
        return -1;
    }
    int rc;
    do
        rc = connect(fd, (const struct sockaddr *)&a->ss, a->len);
    while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno == EINPROGRESS) {
        double deadline = dp_now() + timeout_s;
        int ev;
        while ((ev = dp_sock_wait(fd, POLLOUT, deadline - dp_now())) == 0 && dp_now() < deadline)
            ;
        if (ev < 0) {
            *errno_out = errno;
        } else if (ev == 0) {
            *errno_out = ETIMEDOUT;
        } else {
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
                soerr = errno;
            *errno_out = soerr;
        }
        rc = *errno_out ? -1 : 0;
    } else if (rc != 0) {
        *errno_out = errno;
    }
    if (rc != 0) {
        close(fd);
        return dp_errf(err, "connect to %s: %s", addr, strerror(*errno_out));
    }
    *fd_out = fd;
    return 0;
}

int dp_sock_read_full(int fd, void *buf, size_t len, double deadline, dp_err *err)
{
    char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return dp_errf(err, "connection closed by peer");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return dp_errf(err, "read: %s", strerror(errno));
        double left = deadline - dp_now();
        if (left <= 0)
            return dp_errf(err, "read timed out");
        if (dp_sock_wait(fd, POLLIN, left) < 0)
            return dp_errf(err, "poll: %s", strerror(errno));
    }
    return 0;
}

int dp_sock_write_full(int fd, const void *buf, size_t len, double deadline, dp_err *err)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n >= 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return dp_errf(err, "write: %s", strerror(errno));
        double left = deadline - dp_now();
        if (left <= 0)
            return dp_errf(err, "write timed out");
        if (dp_sock_wait(fd, POLLOUT, left) < 0)
            return dp_errf(err, "poll: %s", strerror(errno));
    }
    return 0;
}

/* Buffers on the wire: [u32 count][count f32] (buffers_wire.h). */
#include "strategy/buffers_wire.h"

#include <sys/uio.h>

#include "downpour/wire.h"

#define HEAD 4 /* the u32 count */

int dp_buffers_send(dp_transport *t, int peer, unsigned type, uint64_t step, uint64_t offset,
                    const float *v, size_t n, dp_err *err)
{
    uint8_t head[HEAD];
    dp_put_u32(head, (uint32_t)n);
    struct iovec iov[2] = {{head, sizeof head}, {(void *)v, n * sizeof(float)}};
    return dp_transport_sendv(t, peer, type, step, offset, iov, 2, err);
}

int dp_buffers_recv(dp_transport *t, const dp_event *ev, const char *who, const char *holder,
                    float *dst, size_t n, dp_err *err)
{
    uint64_t len = ev->header.length, want = HEAD + (uint64_t)n * sizeof(float);
    if (len != want)
        return dp_errf(err, "%s sent %llu bytes of buffers; %s holds %zu buffer floats (%llu "
                            "bytes with the count)", who, (unsigned long long)len, holder, n,
                       (unsigned long long)want);
    uint8_t head[HEAD];
    if (dp_transport_recv_payload(t, ev->peer, head, sizeof head, err) < 0)
        return -2;
    uint32_t count = dp_get_u32(head);
    if (count != n)
        return dp_errf(err, "%s sent %u buffer floats in %llu bytes; %s holds %zu", who, count,
                       (unsigned long long)len, holder, n);
    return dp_transport_recv_payload(t, ev->peer, dst, n * sizeof(float), err) < 0 ? -2 : 0;
}

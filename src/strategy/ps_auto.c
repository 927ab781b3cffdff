/* --compress auto's rule for the ps family: see ps_auto.h. */
#include "strategy/ps_auto.h"

#include <stdio.h>

#include "downpour/compress.h"
#include "downpour/frame.h"
#include "downpour/ps.h"

static const double ratios[DP_PS_AUTO_N_RATIOS] = DP_PS_AUTO_RATIOS;

double dp_ps_auto_rule(dp_ps_auto *a, const size_t *n, int k, double s_per_byte,
                       double codec_s_per_float)
{
    /* each way on its own (the links are full duplex): a step's frames take
     * the longer way's bytes */
    double up0 = 0, down0 = 0, floats = 0, up[DP_PS_AUTO_N_RATIOS] = {0},
           down[DP_PS_AUTO_N_RATIOS] = {0}, coded[DP_PS_AUTO_N_RATIOS];
    for (int s = 0; s < k; s++) {
        /* PUSH_GRAD + PARAMS, or PUSH_CODED of k pairs + a 4-bit PARAMS_CODED */
        up0 += (double)dp_frame_wire_size(DP_PUSH_HEAD_SIZE + 4 * (uint64_t)n[s]);
        down0 += (double)dp_frame_wire_size(4 * (uint64_t)n[s]);
        floats += (double)n[s];
        for (int i = 0; i < DP_PS_AUTO_N_RATIOS; i++) {
            uint64_t pairs = 8 * (uint64_t)dp_topk_count(ratios[i], n[s]);
            up[i] += (double)dp_frame_wire_size(DP_PUSH_HEAD_SIZE + DP_CODED_HEAD_SIZE + pairs);
            down[i] += (double)dp_frame_wire_size(dp_delta4_bytes(n[s]));
        }
    }
    double none = up0 > down0 ? up0 : down0;
    for (int i = 0; i < DP_PS_AUTO_N_RATIOS; i++)
        coded[i] = up[i] > down[i] ? up[i] : down[i];
    a->t_none = none * s_per_byte;
    a->ratio = 0;
    for (int i = 0; i < DP_PS_AUTO_N_RATIOS; i++) {
        a->t[i] = coded[i] * s_per_byte + 2 * floats * codec_s_per_float;
        if (a->t[i] * DP_PS_AUTO_MARGIN <= a->t_none || (i == 0 && a->t[i] < a->t_none))
            a->ratio = ratios[i];
    }
    int at = snprintf(a->why, sizeof a->why, "auto: ");
    at += a->ratio > 0 ? snprintf(a->why + at, sizeof a->why - (size_t)at,
                                  "topk:%g pushes, 4-bit answers", a->ratio)
                       : snprintf(a->why + at, sizeof a->why - (size_t)at, "none");
    at += snprintf(a->why + at, sizeof a->why - (size_t)at,
                   " (a step's frames predicted, the longer way: none %.2f ms (%.0f bytes at "
                   "%.2f ns a byte),",
                   a->t_none * 1e3, none, s_per_byte * 1e9);
    for (int i = 0; i < DP_PS_AUTO_N_RATIOS && at > 0 && (size_t)at < sizeof a->why; i++)
        at += snprintf(a->why + at, sizeof a->why - (size_t)at, " topk:%g %.2f ms (%.0f bytes),",
                       ratios[i], a->t[i] * 1e3, coded[i]);
    if (at > 0 && (size_t)at < sizeof a->why)
        snprintf(a->why + at, sizeof a->why - (size_t)at,
                 " the top-k coder %.2f ns a float, counted twice a step)",
                 codec_s_per_float * 1e9);
    return a->ratio;
}

/* --compress auto's rule for the ps family: see ps_auto.h. */
#include "downpour/ps_auto.h"

#include <stdio.h>
#include <string.h>

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

uint32_t dp_ps_auto_code(double ratio)
{
    for (int i = 0; i < DP_PS_AUTO_N_RATIOS; i++)
        if (ratio == ratios[i])
            return 2 + (uint32_t)i;
    return DP_PS_AUTO_NONE;
}

double dp_ps_auto_ratio(uint32_t code)
{
    return code == DP_PS_AUTO_NONE ? 0 : code >= 2 && code < DP_PS_AUTO_CODES ? ratios[code - 2] : -1;
}

void dp_ps_auto_name(uint32_t code, char *buf, size_t cap)
{
    double r = dp_ps_auto_ratio(code);
    if (r > 0)
        snprintf(buf, cap, "topk:%g", r);
    else
        snprintf(buf, cap, "%s", r == 0 ? "none" : "-");
}

int dp_ps_auto_format(char *buf, size_t cap, const uint32_t *codes, int workers)
{
    size_t at = (size_t)snprintf(buf, cap, "ps_auto=");
    for (int w = 0; w < workers && at < cap; w++) {
        char one[32];
        dp_ps_auto_name(codes[w], one, sizeof one);
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", w ? "," : "", one);
    }
    return at < cap ? 0 : -1;
}

int dp_ps_auto_parse(const char *state, int workers, uint32_t *codes, const char *file,
                     dp_err *err)
{
    /* "k=v k=v ...": the value of ps_auto, up to the next space */
    const char *v = NULL;
    for (const char *p = state; p && *p; p += strcspn(p, " "), p += *p == ' ')
        if (strncmp(p, "ps_auto=", 8) == 0) {
            v = p + 8;
            break;
        }
    if (!v)
        return dp_errf(err, "%s: --compress auto, but metadata 'strategy_state' holds no "
                            "'ps_auto' (the workers' choices; docs/checkpoints.md, "
                            "\"Compression residuals\")", file);
    size_t len = strcspn(v, " ");
    int w = 0;
    for (size_t at = 0; at <= len; w++) {
        size_t l = strcspn(v + at, ", ");
        if (l > len - at)
            l = len - at;
        if (w >= workers)
            return dp_errf(err, "%s: metadata 'strategy_state', 'ps_auto' holds more than the "
                                "%d worker choice(s) of this run", file, workers);
        char one[32], want[32];
        snprintf(one, sizeof one, "%.*s", (int)(l < 31 ? l : 31), v + at);
        codes[w] = DP_PS_AUTO_CODES;
        for (uint32_t c = DP_PS_AUTO_UNSET; c < DP_PS_AUTO_CODES; c++) {
            dp_ps_auto_name(c, want, sizeof want);
            if (l == strlen(want) && strncmp(v + at, want, l) == 0)
                codes[w] = c;
        }
        if (codes[w] == DP_PS_AUTO_CODES)
            return dp_errf(err, "%s: metadata 'strategy_state', 'ps_auto': worker %d's choice "
                                "'%s' is not one --compress auto takes (none, topk:0.01, "
                                "topk:0.02, topk:0.05, topk:0.1, or - for none yet)",
                           file, w, one);
        at += l + 1;
    }
    if (w != workers)
        return dp_errf(err, "%s: metadata 'strategy_state', 'ps_auto' holds %d worker "
                            "choice(s); this run has %d", file, w, workers);
    return 0;
}

uint32_t dp_ps_auto_fallback(const uint32_t *codes, int workers)
{
    for (int w = 0; w < workers; w++)
        if (codes[w] != DP_PS_AUTO_UNSET)
            return codes[w];
    return DP_PS_AUTO_UNSET;
}

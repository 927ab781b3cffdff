/* The --model grammar (docs/models.md): tokens joined by '-', the input shape
 * first, each later token one layer:
 *
 *   784 | 1x28x28          the input: features, or an image C x H x W
 *   300                    dense 300 + relu; the last token: dense + the loss
 *   dense300               dense 300 without an activation
 *   conv5x5x32[sS][pP]     convolution: a 5x5 window, 32 output channels
 *   local5x5x16[sS][pP]    locally connected (untied filters per position)
 *   maxpool2[x2][sS][pP]   max pooling (stride defaults to the window)
 *   avgpool2[x2][sS][pP]   average pooling
 *   lcn5                   local contrast normalisation over 5x5 (odd)
 *   dropout0.5             inverted dropout of that fraction
 *   relu, flatten
 *   res(A) | res(A|B)      a residual block: A(x) + x, or A(x) + B(x) (B a
 *                          projection shortcut); A and B are tokens joined by '-'
 *
 * The loss (softmax_xent) follows the last token, which must be dense.
 * Layouts are inserted where they are needed: an input image of several
 * channels becomes NHWC before the first image layer (hwc), and an image
 * becomes PyTorch's CHW feature order before a dense layer (flatten).
 * Each layer kind's token is parsed and spelled by its own file of the layer
 * table (layer_kind.h); this file holds the grammar around them and the
 * helpers they build with (model_spec.h). */
#include "nn/model_spec.h"

#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WIDTH DP_SPEC_MAX_WIDTH
#define MAX_DIM DP_SPEC_MAX_DIM
#define MAX_FEATURES (1L << 26) /* features of one sample at any layer */
#define MAX_CLASSES 256         /* labels are uint8 */
#define SHOWN_MAX 120           /* a message quotes this much of a spec or a token */

static const struct {
    const char *name, *spec;
} presets[] = {
    {"mlp-300-100", "784-300-100-10"},
    {"mlp-128", "784-128-10"},
    /* the CNN: two 5x5 valid convolutions with 2x2 max pooling */
    {"cnn-mnist", "1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-10"},
    /* DistBelief's image model in small: locally connected filtering,
     * pooling and local contrast normalisation stages */
    {"distbelief-image",
     "1x28x28-local5x5x16-relu-maxpool2-lcn5-local5x5x32-relu-maxpool2-lcn3-128-10"},
    /* mlp-300-100 with batch norm after each hidden dense layer, before its relu */
    {"mlp-bn", "784-dense300-bn-relu-dense100-bn-relu-10"},
    /* a ResNet for 28x28 images (docs/models.md): a 16-channel stem, three
     * stages of two basic blocks at 16, 32 and 64 channels, the first block
     * of the last two halving the image with a 1x1 projection shortcut */
    {"resnet-fashion",
     "1x28x28-conv3x3x16p1-bn-relu"
     "-res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn)-relu"
     "-res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn)-relu"
     "-res(conv3x3x32s2p1-bn-relu-conv3x3x32p1-bn|conv1x1x32s2-bn)-relu"
     "-res(conv3x3x32p1-bn-relu-conv3x3x32p1-bn)-relu"
     "-res(conv3x3x64s2p1-bn-relu-conv3x3x64p1-bn|conv1x1x64s2-bn)-relu"
     "-res(conv3x3x64p1-bn-relu-conv3x3x64p1-bn)-relu"
     "-gap-10"},
    /* a small vision transformer (docs/models.md): 7x7 patches embedded in 64
     * channels (16 tokens) plus learned positions, two pre-norm blocks of
     * 4-head attention and a GELU MLP of 128 (1x1 convs act on each token),
     * a final layer norm and the mean over the tokens */
    {"vit-mnist",
     "1x28x28-conv7x7x64s7-pos"
     "-res(ln-mha4)-res(ln-conv1x1x128-gelu-conv1x1x64)"
     "-res(ln-mha4)-res(ln-conv1x1x128-gelu-conv1x1x64)"
     "-ln-gap-10"},
    /* a click-through model for `downpour data synth ctr`'s default set
     * (docs/models.md, "Click-through models"): 8 categorical features of
     * 1000 ids in tables of width 16 and 4 numeric features; a deep MLP and
     * a wide linear part over the same 132 features, summed into one logit */
    {"wide-deep",
     "12-bag1000x16-bag1000x16-bag1000x16-bag1000x16-bag1000x16-bag1000x16-bag1000x16"
     "-bag1000x16-res(dense64-relu-dense32-relu-dense1|dense1)-bce"},
    /* DLRM in small for the same set: a bottom MLP 4-64-16 on the numeric
     * features (leads, the embeddings passed behind them), the pairwise dot
     * products of its output and the 8 embeddings, a top MLP 52-64-1 */
    {"dlrm",
     "12-bag1000x16-bag1000x16-bag1000x16-bag1000x16-bag1000x16-bag1000x16-bag1000x16"
     "-bag1000x16-lead4x64relu-lead64x16relu-dot16-64-dense1-bce"},
};

const char *dp_model_presets(void)
{
    return "mlp-300-100, mlp-128, cnn-mnist, distbelief-image, mlp-bn, resnet-fashion, vit-mnist, "
           "wide-deep, dlrm";
}

int dp_spec_fail(dp_spec_parser *p, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* a long spec (up to DP_MAX_SPEC) and a long block are cut short, so the
     * token and the reason always fit in the message */
    int shown = (int)strlen(p->shown), tok = p->tok_len;
    const char *more = shown > SHOWN_MAX ? "..." : "", *tmore = tok > SHOWN_MAX ? "..." : "";
    shown = shown > SHOWN_MAX ? SHOWN_MAX : shown;
    tok = tok > SHOWN_MAX ? SHOWN_MAX : tok;
    if (p->tok)
        return dp_errf(p->err, "model spec '%.*s%s': token %d '%.*s%s': %s", shown, p->shown,
                       more, p->tok_no, tok, p->tok, tmore, what);
    return dp_errf(p->err, "model spec '%.*s%s': %s", shown, p->shown, more, what);
}

void dp_spec_emit(dp_spec_parser *p, const char *fmt, ...)
{
    dp_model *m = p->m;
    if (p->spec_len >= sizeof m->spec)
        return;
    va_list ap;
    va_start(ap, fmt);
    p->spec_len += (size_t)vsnprintf(m->spec + p->spec_len, sizeof m->spec - p->spec_len, fmt, ap);
    va_end(ap);
}

long dp_spec_num(const char **s, const char *end, long min, long max)
{
    const char *q = *s;
    long v = 0;
    while (q < end && *q >= '0' && *q <= '9') {
        v = v * 10 + (*q - '0');
        if (v > max)
            v = max + 1; /* stays out of range, never overflows */
        q++;
    }
    if (q == *s)
        return -1;
    *s = q;
    return v < min || v > max ? -2 : v;
}

static bool starts(const char *s, const char *end, const char *word)
{
    size_t n = strlen(word);
    return (size_t)(end - s) >= n && memcmp(s, word, n) == 0;
}

dp_layer *dp_spec_add(dp_spec_parser *p, dp_layer_kind kind)
{
    dp_model *m = p->m;
    if (m->n_layers == DP_MAX_LAYERS) {
        dp_spec_fail(p, "more than %d layers", DP_MAX_LAYERS);
        return NULL;
    }
    dp_layer *d = &m->layers[m->n_layers++];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->c = d->oc = p->c;
    d->h = d->oh = p->h;
    d->w = d->ow = p->w;
    d->in = d->out = p->c * p->h * p->w;
    return d;
}

int dp_spec_out(dp_spec_parser *p, dp_layer *d, int oc, int oh, int ow)
{
    long feats = (long)oc * oh * ow;
    if (feats > MAX_FEATURES)
        return dp_spec_fail(p, "%d x %d x %d = %ld features per sample, at most %ld", oc, oh, ow,
                                    feats,
                            MAX_FEATURES);
    d->oc = oc, d->oh = oh, d->ow = ow;
    d->out = (int)feats;
    p->c = oc, p->h = oh, p->w = ow;
    return 0;
}

int dp_spec_params(dp_spec_parser *p, dp_layer *d, size_t w_len, size_t b_len)
{
    if (p->m->n_dense == DP_MAX_DENSE)
        return dp_spec_fail(p, "more than %d layers with parameters", DP_MAX_DENSE);
    p->m->n_dense++;
    d->w_off = p->off;
    d->w_len = w_len;
    d->b_off = p->off + w_len;
    d->b_len = b_len;
    p->off += w_len + b_len;
    return 0;
}

void dp_spec_buffers(dp_spec_parser *p, dp_layer *d, size_t len)
{
    d->s_off = p->boff;
    d->s_len = len;
    p->boff += len;
}

int dp_spec_need_image(dp_spec_parser *p)
{
    if (p->flat || p->h * p->w == 1)
        return dp_spec_fail(p, "needs an image, but its input is a flat vector of %d features "
                               "(give the input as CxHxW, e.g. 1x28x28; images end at the first "
                               "dense, flatten or gap)",
                            p->c * p->h * p->w);
    if (!p->hwc && p->c > 1 && !dp_spec_add(p, DP_LAYER_HWC))
        return -1;
    p->hwc = true;
    return 0;
}

/* An image of several channels stored NHWC goes to CHW order, then the
 * activations are flat. */
int dp_spec_to_flat(dp_spec_parser *p)
{
    if (p->hwc && p->c > 1 && p->h * p->w > 1) {
        dp_layer *d = dp_spec_add(p, DP_LAYER_FLATTEN);
        if (!d)
            return -1;
        d->oc = d->out, d->oh = d->ow = 1;
    }
    p->c = p->c * p->h * p->w;
    p->h = p->w = 1;
    p->hwc = false;
    p->flat = true;
    return 0;
}

int dp_spec_dense(dp_spec_parser *p, long n, bool relu)
{
    if (dp_spec_to_flat(p) < 0)
        return -1;
    dp_layer *d = dp_spec_add(p, DP_LAYER_DENSE);
    if (!d || dp_spec_out(p, d, (int)n, 1, 1) < 0 ||
        dp_spec_params(p, d, (size_t)d->in * (size_t)n, (size_t)n) < 0)
        return -1;
    return relu && !dp_spec_add(p, DP_LAYER_RELU) ? -1 : 0;
}

int dp_spec_window_opts(dp_spec_parser *p, const char *s, const char *end, int *stride,
                        int *pad)
{
    while (s < end) {
        const char *at = s;
        char o = *s++;
        long v = o == 's' || o == 'p' ? dp_spec_num(&s, end, o == 'p' ? 0 : 1, MAX_DIM) : -1;
        if (v == -1)
            return dp_spec_fail(p, "unexpected '%.*s' (options are s<stride> and p<padding>, like "
                                   "conv3x3x64s2p1)",
                                (int)(end - at), at);
        if (v == -2)
            return dp_spec_fail(p, "%s out of range [%d, %d]", o == 's' ? "stride" : "padding",
                                o == 's', MAX_DIM);
        *(o == 's' ? stride : pad) = (int)v;
    }
    return 0;
}

/* The window of a token: KHxKWxOC (oc given), or K or KHxKW (pools). */
static bool next_num(const char **s, const char *end, long *v)
{
    if (*s >= end || **s != 'x')
        return false;
    (*s)++;
    *v = dp_spec_num(s, end, 1, MAX_DIM);
    return *v > 0;
}

int dp_spec_window_size(dp_spec_parser *p, const char **s, const char *end, int *kh, int *kw,
                        int *oc)
{
    long a = dp_spec_num(s, end, 1, MAX_DIM), b = a, c = 1;
    bool ok = a > 0;
    if (ok && (oc || (*s < end && **s == 'x')))
        ok = next_num(s, end, &b);
    if (ok && oc)
        ok = next_num(s, end, &c);
    if (!ok)
        return dp_spec_fail(p, oc ? "expected KHxKWxC: window height, width and output channels, "
                                    "each in [1, %d], like conv5x5x32"
                                  : "expected a window K or KHxKW in [1, %d], like maxpool2",
                            MAX_DIM);
    *kh = (int)a;
    *kw = (int)b;
    if (oc)
        *oc = (int)c;
    return 0;
}

int dp_spec_window(dp_spec_parser *p, dp_layer *d, int kh, int kw, int stride, int pad)
{
    if (pad >= kh || pad >= kw)
        return dp_spec_fail(p, "padding %d must be smaller than the %dx%d window", pad, kh, kw);
    if (dp_window_init(&d->win, p->c, p->h, p->w, kh, kw, stride, pad) < 0)
        return dp_spec_fail(p, "a %dx%d window is larger than its %dx%d input (with padding %d)",
                            kh, kw, p->h, p->w, pad);
    return 0;
}

/* The first token: N, or C x H x W. */
static int input(dp_spec_parser *p, const char *s, const char *end)
{
    long a = dp_spec_num(&s, end, 1, MAX_FEATURES), h = 1, w = 1;
    if (a > 0 && s < end && *s == 'x') {
        s++;
        h = dp_spec_num(&s, end, 1, MAX_DIM);
        if (h > 0 && s < end && *s == 'x') {
            s++;
            w = dp_spec_num(&s, end, 1, MAX_DIM);
        } else {
            h = -1;
        }
    }
    if (a < 1 || h < 1 || w < 1 || s != end)
        return dp_spec_fail(p, "expected the input as N features (like 784) or an image CxHxW "
                               "(like 1x28x28)%s",
                            a == -1 ? ", or a preset" : "");
    if (a * h * w > MAX_FEATURES)
        return dp_spec_fail(p, "%ld input features, at most %ld", a * h * w, MAX_FEATURES);
    p->c = (int)a, p->h = (int)h, p->w = (int)w;
    if (h * w > 1)
        dp_spec_emit(p, "%ldx%ldx%ld", a, h, w);
    else
        dp_spec_emit(p, "%ld", a);
    return 0;
}

const char *dp_model_spec_help(void)
{
    static char help[4096]; /* grows with the table of kinds */
    if (help[0])
        return help;
    const char *pad = "                               ";
    size_t len = (size_t)snprintf(help, sizeof help,
                                  "a preset: %s;\n%.29sor layers joined by '-', the input first "
                                  "(784, or an image 1x28x28):\n%s128         dense + relu (the "
                                  "last one: the classes, before the loss)\n",
                                  dp_model_presets(), pad, pad);
    for (int k = 0; k < DP_LAYER_KIND_COUNT && len < sizeof help; k++)
        if (dp_layer_table[k]->example)
            len += (size_t)snprintf(help + len, sizeof help - len, "%s%-11s %s\n", pad,
                                    dp_layer_table[k]->example, dp_layer_table[k]->help);
    if (len < sizeof help)
        snprintf(help + len, sizeof help - len, "%.29se.g. %s", pad,
                 "1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-10");
    return help;
}

/* The kind whose token this is (layer_kind.h: a prefix, or the whole token). */
static const dp_layer_ops *kind_of_token(const char *s, const char *end)
{
    for (int k = 0; k < DP_LAYER_KIND_COUNT; k++) {
        const dp_layer_ops *o = dp_layer_table[k];
        size_t n = strlen(o->name);
        if (o->token && starts(s, end, o->name) && (o->token == 1 || (size_t)(end - s) == n))
            return o;
    }
    return NULL;
}

static int unknown(dp_spec_parser *p)
{
    char known[256] = "";
    size_t len = 0;
    for (int k = 0; k < DP_LAYER_KIND_COUNT && len < sizeof known; k++)
        if (dp_layer_table[k]->token)
            len += (size_t)snprintf(known + len, sizeof known - len, ", %s",
                                    dp_layer_table[k]->name);
    return dp_spec_fail(p, "unknown layer (known: a width like 128%s, and blocks res(...))", known);
}

static int token(dp_spec_parser *p, const char *s, const char *end, bool last)
{
    long n;
    const char *q = s;
    if ((n = dp_spec_num(&q, end, 1, MAX_WIDTH)) != -1 && q == end) { /* a bare width */
        if (n < 1)
            return dp_spec_fail(p, "width out of range [1, %d]", MAX_WIDTH);
        dp_spec_emit(p, "-%ld", n);
        return dp_spec_dense(p, n, !last);
    }
    if (*s >= '0' && *s <= '9')
        return dp_spec_fail(p, "not a number (a width) nor a layer");
    const dp_layer_ops *o = kind_of_token(s, end);
    if (last && !(o && (o->flags & (DP_LK_CLASSIFIER | DP_LK_LOSS))))
        return dp_spec_fail(p, "the last layer must be dense (its width is the number of "
                                       "classes), like ...-10, or a loss (...-dense1-bce)");
    if (!o)
        return unknown(p);
    int before = p->m->n_layers;
    size_t mark = p->spec_len;
    p->last = last;
    dp_spec_emit(p, "-%.*s", (int)(end - s), s);
    int rc = o->parse(p, s + strlen(o->name), end);
    if (rc == 0 && o->emit && p->m->n_layers > before) { /* its canonical spelling */
        p->spec_len = mark;
        o->emit(p, &p->m->layers[p->m->n_layers - 1]);
    }
    return rc;
}

/* The shape of the activations at a point of the spec. */
typedef struct shape {
    int c, h, w;
    bool hwc, flat;
} shape;

static shape shape_of(const dp_spec_parser *p)
{
    return (shape){p->c, p->h, p->w, p->hwc, p->flat};
}

static void shape_set(dp_spec_parser *p, shape s)
{
    p->c = s.c, p->h = s.h, p->w = s.w, p->hwc = s.hwc, p->flat = s.flat;
}

static bool shape_image(shape s) { return !s.flat && s.h * s.w > 1; }

static bool shape_same(shape a, shape b)
{
    return shape_image(a) == shape_image(b) && a.c * a.h * a.w == b.c * b.h * b.w &&
           (!shape_image(a) || (a.c == b.c && a.h == b.h && a.w == b.w));
}

static void shape_text(char *buf, size_t n, shape s)
{
    if (!shape_image(s))
        snprintf(buf, n, "%d features", s.c * s.h * s.w);
    else
        snprintf(buf, n, "%dx%dx%d", s.c, s.h, s.w);
}

/* A residual block being parsed: res(main) or res(main|shortcut)
 * (docs/models.md, "Residual blocks"). */
typedef struct block {
    bool open, in_sc;
    const char *at; /* its text, from "res(" */
    int tok_no;
    int first, sc;  /* its first layer, its shortcut's first (0: identity) */
    shape in, main; /* the shapes at its input and at its main branch's output */
} block;

static int block_open(dp_spec_parser *p, block *b, const char *at)
{
    if (b->open)
        return dp_spec_fail(p, "a res( block inside another: nested blocks are not supported");
    /* an image of several channels goes NHWC before the block, so both
     * branches add in one layout */
    if (!p->flat && p->h * p->w > 1 && p->c > 1 && !p->hwc && dp_spec_need_image(p) < 0)
        return -1;
    *b = (block){.open = true, .at = at, .tok_no = p->tok_no, .first = p->m->n_layers,
                 .in = shape_of(p)};
    dp_spec_emit(p, "-res(");
    return 0;
}

static int block_bar(dp_spec_parser *p, block *b)
{
    if (!b->open || b->in_sc)
        return dp_spec_fail(p, b->open ? "a second '|' in a res( block (one shortcut)"
                                       : "'|' outside a res( block");
    b->in_sc = true;
    b->main = shape_of(p);
    b->sc = p->m->n_layers;
    shape_set(p, b->in);
    dp_spec_emit(p, "|");
    return 0;
}

/* At its ')': the branches must agree; the res layer sums them. */
static int block_close(dp_spec_parser *p, block *b, const char *close)
{
    dp_model *m = p->m;
    if (!b->open)
        return dp_spec_fail(p, "')' without its res(");
    if (!b->in_sc)
        b->main = shape_of(p);
    shape other = b->in_sc ? shape_of(p) : b->in; /* the shortcut's output, or the block's input */
    p->tok = b->at, p->tok_len = (int)(close + 1 - b->at), p->tok_no = b->tok_no;
    if (!shape_same(b->main, other)) {
        char a[64], o[64];
        shape_text(a, sizeof a, b->main);
        shape_text(o, sizeof o, other);
        return dp_spec_fail(p, "the main branch gives %s but the %s shortcut gives %s: they "
                               "must match to be added%s",
                            a, b->in_sc ? "projection" : "identity", o,
                            b->in_sc ? "" : " (give a projection after '|', like "
                                            "res(conv3x3x32s2p1-bn-relu-conv3x3x32p1-bn|"
                                            "conv1x1x32s2-bn))");
    }
    shape_set(p, b->main);
    dp_layer *d = dp_spec_add(p, DP_LAYER_RES);
    if (!d)
        return -1;
    for (int l = b->first; l < m->n_layers; l++)
        m->layers[l].res |= DP_RES_IN;
    m->layers[b->first].res |= DP_RES_BEGIN;
    if (b->sc) {
        m->layers[b->sc].res |= DP_RES_SHORTCUT;
        m->layers[b->sc].res_from = b->first;
    }
    d->res |= DP_RES_ADD;
    d->res_from = b->first;
    d->res_sc = b->sc;
    dp_spec_emit(p, ")");
    b->open = b->in_sc = false;
    return 0;
}

static int empty_token(dp_spec_parser *p, int t, char at_end, const block *b)
{
    if (b->open)
        return dp_spec_fail(p, "an empty branch or token in a res( block (a branch holds "
                               "layers, like res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn))");
    return dp_spec_fail(p, t == 1 ? "the spec starts with '-'"
                           : !at_end ? "empty token between two '-'"
                                     : "the spec ends with '-' (a layer is missing)");
}

int model_spec_parse(dp_model *m, const char *spec, dp_err *err)
{
    const char *text = spec, *preset = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(spec, presets[i].name) == 0)
            preset = presets[i].name, text = presets[i].spec;
    dp_spec_parser p = {.m = m, .shown = spec, .err = err};
    if (!*text)
        return dp_spec_fail(&p, "is empty (expected a preset: %s; or layers like 784-300-100-10 or "
                                "1x28x28-conv5x5x32-relu-maxpool2-128-10)",
                            dp_model_presets());
    if (strlen(text) >= DP_MAX_SPEC)
        return dp_spec_fail(&p, "longer than %d characters", DP_MAX_SPEC - 1);
    const char *s = text, *text_end = text + strlen(text);
    block b = {0};
    bool closed_last = false; /* the last thing parsed was a block's ')' */
    int t = 0;
    for (;;) {
        t++;
        p.tok = s, p.tok_len = (int)strcspn(s, "-|()"), p.tok_no = t;
        if (t > 1 && starts(s, text_end, "res(")) {
            if (block_open(&p, &b, s) < 0)
                return -1;
            s += 4;
            p.tok = s, p.tok_len = (int)strcspn(s, "-|()");
        }
        const char *end = s + p.tok_len;
        if (end == s)
            return empty_token(&p, t, !*end, &b);
        if (*end == '(')
            return dp_spec_fail(&p, "unexpected '(' (a residual block is res(...))");
        if (t == 1 && !*end && !(*s >= '0' && *s <= '9')) {
            p.tok = NULL;
            return dp_spec_fail(&p, "not a preset (%s) nor layers joined by '-' like "
                                    "784-300-100-10",
                                dp_model_presets());
        }
        /* a branch's first token is spelled without its '-' */
        bool branch_start = b.open && (s[-1] == '(' || s[-1] == '|');
        size_t mark = p.spec_len;
        int before = m->n_layers;
        if ((t == 1 ? input(&p, s, end) : token(&p, s, end, !*end && !b.open)) < 0)
            return -1;
        if (b.open && m->n_layers == before)
            return dp_spec_fail(&p, "makes no layer, which a res( block cannot hold");
        if (branch_start && mark < sizeof m->spec && m->spec[mark] == '-') {
            memmove(m->spec + mark, m->spec + mark + 1, p.spec_len - mark);
            p.spec_len--;
        }
        s = end;
        closed_last = false;
        if (*s == '|') {
            if (block_bar(&p, &b) < 0)
                return -1;
            s++;
            continue;
        }
        while (*s == ')') {
            if (block_close(&p, &b, s) < 0)
                return -1;
            s++;
            closed_last = true;
        }
        if (!*s)
            break;
        if (*s != '-')
            return dp_spec_fail(&p, "expected '-' after ')', found '%c'", *s);
        s++;
        if (!*s) {
            p.tok = s, p.tok_len = 0, p.tok_no = t + 1;
            return empty_token(&p, t + 1, true, &b);
        }
    }
    if (b.open) {
        p.tok = b.at, p.tok_len = (int)(text_end - b.at), p.tok_no = b.tok_no;
        return dp_spec_fail(&p, "res( without its ')'");
    }
    if (closed_last)
        return dp_spec_fail(&p, "the last layer must be dense (its width is the number of "
                                "classes), like ...-10, not a block");
    p.tok = NULL;
    if (t < 2)
        return dp_spec_fail(&p, "needs at least the input and the classes (like 784-10)");
    if (p.spec_len >= sizeof m->spec)
        return dp_spec_fail(&p, "its canonical spelling is longer than %d characters",
                                    DP_MAX_SPEC - 1);
    /* the loss: the last token's own (bce), else softmax_xent after it */
    if (!(dp_layer_ops_of(&m->layers[m->n_layers - 1])->flags & DP_LK_LOSS)) {
        if (p.c > MAX_CLASSES)
            return dp_spec_fail(&p, "%d classes, at most %d (labels are 8-bit)", p.c,
                                MAX_CLASSES);
        if (!dp_spec_add(&p, DP_LAYER_SOFTMAX_XENT))
            return -1;
    }
    m->n_params = p.off;
    m->n_buffers = p.boff;
    snprintf(m->name, sizeof m->name, "%s", preset ? preset : m->spec);
    return 0;
}

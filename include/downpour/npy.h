/* NumPy arrays: .npy files (format versions 1.0, 2.0 and 3.0) and the arrays
 * inside .npz archives (numpy.savez: stored members; numpy.savez_compressed:
 * deflated members; ZIP64 as numpy writes it), read a range of rows at a time.
 *
 * The header ("\x93NUMPY", version, a u16 or u32 length, then a Python dict
 * literal with exactly 'descr', 'fortran_order' and 'shape') is parsed
 * strictly; the data must be exactly as long as the shape and dtype say (a
 * truncated file or trailing bytes are refused).  Row i is index i of the
 * first axis; a row holds the product of the other axes' elements.
 *
 * dtypes: b1, u1, i1, u2, i2, u4, i4, u8, i8, f4, f8, little- or big-endian
 * ('<', '>', '|' for one byte, '=' as this machine's order).  Object arrays
 * (pickles), strings, structured, complex, half and date types are refused
 * naming the dtype.  fortran_order True is accepted where it changes nothing
 * (at most one axis longer than 1, such as (n,) or (n, 1)), and refused
 * otherwise with the fix (np.ascontiguousarray).
 *
 * Access: a .npy file and a stored .npz member are read with pread at the
 * rows' offsets, so rows [lo, hi) cost only their bytes, in any order.  A
 * deflated member is inflated in order through 64 KiB buffers: reading
 * forward is streaming, reading behind the last position inflates again from
 * the member's start (random access into it is sequential; convert to .npy or
 * savez without compression for that).  Memory is bounded: a handle holds a
 * 1 MiB staging buffer and, for a deflated member, two 64 KiB buffers and
 * zlib's state, whatever the array's size.
 *
 * Errors name the file (and the member), the field or row, and the fix:
 *   "data/x.npz (member x_train.npy): label 10 at row 4711 is not below the
 *    class count 10" */
#ifndef DOWNPOUR_NPY_H
#define DOWNPOUR_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

/* numpy allows 64 axes; a dataset never needs more than a few. */
#define DP_NPY_MAX_NDIM 16

typedef enum dp_npy_dtype {
    DP_NPY_BOOL,
    DP_NPY_U8,
    DP_NPY_I8,
    DP_NPY_U16,
    DP_NPY_I16,
    DP_NPY_U32,
    DP_NPY_I32,
    DP_NPY_U64,
    DP_NPY_I64,
    DP_NPY_F32,
    DP_NPY_F64,
    DP_NPY_DTYPE_COUNT
} dp_npy_dtype;

typedef struct dp_npy_info {
    dp_npy_dtype dtype;
    char descr[16];       /* as the header spells it, e.g. "<f4" */
    int big_endian;
    int fortran_order;    /* as the header says (accepted only where it changes nothing) */
    int version;          /* format major version: 1, 2 or 3 */
    int ndim;             /* 1..DP_NPY_MAX_NDIM (a 0-d array is refused) */
    uint64_t shape[DP_NPY_MAX_NDIM];
    uint64_t rows;        /* shape[0] */
    uint64_t row_elems;   /* product of shape[1..]; 1 for a 1-D array */
    size_t itemsize;      /* bytes per element in the file */
    int deflated;         /* 1: a deflated .npz member, read in order (see above) */
} dp_npy_info;

typedef struct dp_npy dp_npy;

/* Opens an array: member NULL for a .npy file, or an .npz archive's member by
 * name ("x_train" or "x_train.npy"; keras's mnist.npz holds x_train, y_train,
 * x_test, y_test).  The kind is told by content, not by name: an .npz given
 * without a member, or a .npy given with one, is refused naming the members
 * or the mistake. */
int dp_npy_open(dp_npy **out, const char *path, const char *member, dp_err *err);
void dp_npy_close(dp_npy *a); /* NULL is a no-op */

const dp_npy_info *dp_npy_get_info(const dp_npy *a);
const char *dp_npy_dtype_name(dp_npy_dtype t); /* "uint8", "float32", ... */

/* Rows [lo, hi) as floats, raw values (images stay 0..255: the caller
 * scales): out holds (hi - lo) * row_elems floats.  A NaN or infinity, or a
 * float64 beyond float's range, is refused naming the row. */
int dp_npy_read_f32(dp_npy *a, uint64_t lo, uint64_t hi, float *out, dp_err *err);

/* Rows [lo, hi) of a uint8 array as its bytes, unconverted: out holds
 * (hi - lo) * row_elems bytes.  Any other dtype is refused. */
int dp_npy_read_u8(dp_npy *a, uint64_t lo, uint64_t hi, uint8_t *out, dp_err *err);

/* Rows [lo, hi) of an integer or bool array as int64s, exactly (categorical
 * ids: docs/datasets.md, "Categorical and numeric columns"): out holds
 * (hi - lo) * row_elems values.  A float dtype is refused, and so is a
 * uint64 value above INT64_MAX, naming the row. */
int dp_npy_read_i64(dp_npy *a, uint64_t lo, uint64_t hi, int64_t *out, dp_err *err);

/* Rows [lo, hi) of a label array (shape (n,) or (n, 1)) as class indices in
 * [0, classes): a negative, non-integral (a float such as 2.5) or too large
 * value is refused naming the row.  Any integer, bool or float dtype. */
int dp_npy_read_labels(dp_npy *a, uint64_t lo, uint64_t hi, uint32_t classes, uint32_t *out,
                       dp_err *err);

/* The array names of an .npz archive (".npy" dropped, as numpy's keys), in
 * archive order: *names is malloc'd, free with dp_npz_list_free. */
int dp_npz_list(const char *path, char ***names, size_t *n, dp_err *err);
void dp_npz_list_free(char **names, size_t n);

#endif

/* omrt_custom.h: the C interface of a custom operator packed into an omrt model (custom ABI 1).
 *
 * A custom operator's kernel is one exported function with the `omrt_custom_fn` signature:
 *
 *     #include "omrt_custom.h"
 *
 *     OMRT_EXPORT int my_op(const omrt_tensor *inputs, int n_inputs,
 *                           const omrt_tensor *outputs, int n_outputs,
 *                           void *workspace, size_t workspace_bytes,
 *                           const char *attrs_json, char *error, size_t error_bytes);
 *
 * omrt calls it once per run of the node, with:
 * - `inputs`: the node's inputs, in order; read them, never write them. An absent optional input
 *   has data NULL, dtype OMRT_UNDEFINED and rank 0.
 * - `outputs`: the node's outputs, with the dtypes and shapes the operator's infer function (or
 *   output rules) gave; write every element of each, and nothing outside them.
 * - `workspace`: scratch memory of `workspace_bytes` bytes (the operator's declared workspace),
 *   NULL when it declares none; its contents are undefined on entry.
 * - `attrs_json`: the node's attributes over the operator's defaults, as JSON text with sorted
 *   keys and no spaces ({"alpha":0.5,"axis":-1}); `omrt_attr_number` reads a number from it.
 *
 * Every tensor is C-contiguous and aligned for its dtype; omrt checks this, and each size, before
 * the call. Return 0 on success. On failure write a NUL-terminated message into `error` (at most
 * `error_bytes` bytes, OMRT_FAIL does it) and return nonzero: omrt raises a KernelError naming the
 * operator, the node and the message. The function may be called from several threads at once for
 * different sessions: keep no mutable global state.
 *
 * Build it with `omrt compile` (CustomOp(c_source=...)), or yourself into a shared library:
 *     cc -O2 -shared -fPIC -I "$(python -c 'import omrt.native.custom as c; print(c.INCLUDE)')" \
 *        my_op.c -o libmy_op.so
 */
#ifndef OMRT_CUSTOM_H
#define OMRT_CUSTOM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OMRT_CUSTOM_ABI 1

#define OMRT_EXPORT __attribute__((visibility("default")))

/* Data types: the numbers of ONNX's TensorProto.DataType. */
enum {
    OMRT_UNDEFINED = 0,
    OMRT_FLOAT = 1,
    OMRT_UINT8 = 2,
    OMRT_INT8 = 3,
    OMRT_UINT16 = 4,
    OMRT_INT16 = 5,
    OMRT_INT32 = 6,
    OMRT_INT64 = 7,
    OMRT_BOOL = 9,
    OMRT_FLOAT16 = 10,
    OMRT_DOUBLE = 11,
    OMRT_UINT32 = 12,
    OMRT_UINT64 = 13
};

typedef struct omrt_tensor {
    void *data;           /* the first element; C-contiguous */
    int32_t dtype;        /* OMRT_FLOAT, ... */
    int32_t rank;         /* number of dims */
    const int64_t *shape; /* rank sizes */
    int64_t size;         /* elements: the product of the shape */
    int64_t nbytes;       /* size times the element's bytes */
} omrt_tensor;

typedef int (*omrt_custom_fn)(const omrt_tensor *inputs, int n_inputs, const omrt_tensor *outputs,
                              int n_outputs, void *workspace, size_t workspace_bytes,
                              const char *attrs_json, char *error, size_t error_bytes);

/* Write a message into `error` and return 1 from the kernel: OMRT_FAIL("axis %d", axis). */
#define OMRT_FAIL(...) do { snprintf(error, error_bytes, __VA_ARGS__); return 1; } while (0)

/* The number attribute `name` of `attrs_json`, or `fallback` when it is absent or not a number. */
static inline double omrt_attr_number(const char *attrs_json, const char *name, double fallback) {
    char key[256];
    int n = snprintf(key, sizeof key, "\"%s\":", name);
    if (n < 0 || (size_t)n >= sizeof key || attrs_json == NULL) return fallback;
    const char *at = strstr(attrs_json, key);
    if (at == NULL) return fallback;
    char *end;
    double value = strtod(at + n, &end);
    return end == at + n ? fallback : value;
}

#endif

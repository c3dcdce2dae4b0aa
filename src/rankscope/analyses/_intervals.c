/* Interval union and sorted lookup in one pass each: the optional C side of rankscope.analyses.intervals
 * (whose numpy functions are the reference and the fallback).
 *
 * union(starts, ends, order, out_starts, out_ends) -> m
 *   `order` sorts `starts` (any order among equal starts). Walks the intervals in that order,
 *   skips the empty and negative ones (end <= start), and merges each into the current run while
 *   it starts at or before the run's end; writes the m runs (sorted, disjoint, none touching) to
 *   out_starts[:m], out_ends[:m].
 *
 * find_sorted(keys, values, out) -> None (out: written)
 *   keys sorted ascending. Per value, the index of the first key equal to it, or -1. Values come
 *   nearly sorted (correlation ids of events in time order): a value at or after the one before
 *   it is searched forward from that one's place (galloping), any other by bisection.
 *
 * Every array is a C-contiguous int64 buffer (the outputs writable, as long as the inputs).
 */
#include "_int64s.h"

static PyObject *py_union(PyObject *self, PyObject *args) {
    PyObject *o[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &o[0], &o[1], &o[2], &o[3], &o[4]))
        return NULL;
    static const char *names[5] = {"starts", "ends", "order", "out_starts", "out_ends"};
    Int64s a[5];
    int got = get_int64s_all(o, a, names, 5, 3);
    if (got < 5)
        goto fail;
    Py_ssize_t n = a[0].n;
    if (a[1].n != n || a[2].n != n || a[3].n < n || a[4].n < n) {
        PyErr_SetString(PyExc_ValueError, "union: starts, ends and order differ in length, or an output is shorter");
        goto fail;
    }
    const int64_t *s = a[0].data, *e = a[1].data, *order = a[2].data;
    int64_t *out_s = a[3].data, *out_e = a[4].data;
    Py_ssize_t m = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (order[k] < 0 || order[k] >= n) {
            PyErr_SetString(PyExc_IndexError, "union: order holds a position outside the intervals");
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t i = order[k], si = s[i], ei = e[i];
        if (ei <= si)
            continue;
        if (m > 0 && si <= out_e[m - 1]) {
            if (ei > out_e[m - 1])
                out_e[m - 1] = ei;
        } else {
            out_s[m] = si;
            out_e[m] = ei;
            m++;
        }
    }
    Py_END_ALLOW_THREADS
    release_int64s(a, got);
    return PyLong_FromSsize_t(m);
fail:
    release_int64s(a, got);
    return NULL;
}

/* first index in keys[lo:n] whose key is >= v (n when none) */
static Py_ssize_t lower_bound(const int64_t *keys, Py_ssize_t lo, Py_ssize_t n, int64_t v) {
    Py_ssize_t hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static PyObject *py_find_sorted(PyObject *self, PyObject *args) {
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2]))
        return NULL;
    static const char *names[3] = {"keys", "values", "out"};
    Int64s a[3];
    int got = get_int64s_all(o, a, names, 3, 2);
    if (got < 3)
        goto fail;
    if (a[2].n < a[1].n) {
        PyErr_SetString(PyExc_ValueError, "find_sorted: out is shorter than values");
        goto fail;
    }
    const int64_t *keys = a[0].data, *values = a[1].data;
    int64_t *out = a[2].data;
    Py_ssize_t n = a[0].n, m = a[1].n;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t at = 0;              /* the previous value's place: first key >= it */
    int64_t prev = 0;
    for (Py_ssize_t q = 0; q < m; q++) {
        int64_t v = values[q];
        if (q > 0 && v >= prev) {   /* gallop forward from the previous place */
            Py_ssize_t step = 1, lo = at, hi = at;
            while (hi < n && keys[hi] < v) {
                lo = hi + 1;
                hi = at + step;
                step *= 2;
            }
            at = lower_bound(keys, lo, hi < n ? hi : n, v);
        } else {
            at = lower_bound(keys, 0, n, v);
        }
        prev = v;
        out[q] = (at < n && keys[at] == v) ? at : -1;
    }
    Py_END_ALLOW_THREADS
    release_int64s(a, got);
    Py_RETURN_NONE;
fail:
    release_int64s(a, got);
    return NULL;
}

static PyMethodDef methods[] = {
    {"union", py_union, METH_VARARGS, "Merge intervals walked in a sorting order into disjoint runs."},
    {"find_sorted", py_find_sorted, METH_VARARGS, "Index of each value's first equal key, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_intervals", NULL, -1, methods};

PyMODINIT_FUNC PyInit__intervals(void) { return PyModule_Create(&module); }

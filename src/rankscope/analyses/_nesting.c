/* Nesting of host-op intervals in one pass: the optional C side of rankscope.analyses.nesting.
 *
 * parents(g, s, e, parent) -> conflicts: int (parent: written)
 *   Intervals [s, e) with e > s, sorted by (g, s, -e). depth(i) = how many earlier intervals of
 *   i's group are still open at s(i) (end > s(i)); the candidate parent of i is the latest
 *   earlier interval, of any group, of depth depth(i) - 1. It is i's parent when it has i's
 *   group and encloses i (s <= s(i), e >= e(i)); an interval of depth > 0 without one is a
 *   conflict (it overlaps an earlier one partly) and gets parent -1.
 *   The open intervals of the current group are a binary min-heap of their ends.
 *
 * innermost(g, s, e, parent, qg, qt, out) -> None (out: written)
 *   Per query, the innermost interval of group qg that contains time qt (s <= qt < e), or -1:
 *   the last interval (in sort order) with (g, s) <= (qg, qt), then its parents until one ends
 *   after qt. A query at or after the one before it searches forward from that one's answer.
 *
 * Every array is a C-contiguous int64 buffer (the outputs writable); the numpy version in
 * rankscope.analyses.rank.operators (_Forest) is the reference.
 */
#include "_int64s.h"
#include <stdlib.h>

static void heap_push(int64_t *heap, Py_ssize_t *size, int64_t v) {
    Py_ssize_t i = (*size)++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (heap[up] <= v) break;
        heap[i] = heap[up];
        i = up;
    }
    heap[i] = v;
}

static void heap_pop(int64_t *heap, Py_ssize_t *size) {
    int64_t v = heap[--(*size)];
    Py_ssize_t i = 0, n = *size;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap[c + 1] < heap[c]) c++;
        if (heap[c] >= v) break;
        heap[i] = heap[c];
        i = c;
    }
    if (n) heap[i] = v;
}

static PyObject *parents(PyObject *self, PyObject *args) {
    PyObject *objs[4];
    static const char *names[4] = {"g", "s", "e", "parent"};
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3])) return NULL;
    Int64s a[4];
    PyObject *result = NULL;
    int64_t *heap = NULL, *last_at_depth = NULL;
    int got = get_int64s_all(objs, a, names, 4, 3);
    if (got < 4) goto done;
    Py_ssize_t n = a[0].n;
    if (a[1].n != n || a[2].n != n || a[3].n != n) {
        PyErr_SetString(PyExc_ValueError, "array lengths differ");
        goto done;
    }
    heap = malloc((n ? n : 1) * sizeof(int64_t));
    last_at_depth = malloc((n ? n : 1) * sizeof(int64_t));
    if (!heap || !last_at_depth) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *g = a[0].data, *s = a[1].data, *e = a[2].data;
    int64_t *parent = (int64_t *)a[3].view.buf;
    long long conflicts = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t open = 0, depths = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == 0 || g[i] != g[i - 1]) open = 0;                    /* a new group */
        while (open && heap[0] <= s[i]) heap_pop(heap, &open);
        Py_ssize_t depth = open;
        int64_t p = -1;
        if (depth > 0) {
            int64_t c = depth - 1 < depths ? last_at_depth[depth - 1] : -1;
            if (c >= 0 && g[c] == g[i] && s[c] <= s[i] && e[c] >= e[i])
                p = c;
            else
                conflicts++;
        }
        parent[i] = p;
        while (depths <= depth) last_at_depth[depths++] = -1;
        last_at_depth[depth] = i;
        heap_push(heap, &open, e[i]);
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(conflicts);
done:
    free(heap);
    free(last_at_depth);
    release_int64s(a, got);
    return result;
}

/* interval i is at or before (qg, qt) in (g, s) order */
#define AT_OR_BEFORE(i, qg_, qt_) (g[i] < (qg_) || (g[i] == (qg_) && s[i] <= (qt_)))

static PyObject *innermost(PyObject *self, PyObject *args) {
    PyObject *objs[7];
    static const char *names[7] = {"g", "s", "e", "parent", "qg", "qt", "out"};
    if (!PyArg_ParseTuple(args, "OOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6]))
        return NULL;
    Int64s a[7];
    PyObject *result = NULL;
    int got = get_int64s_all(objs, a, names, 7, 6);
    if (got < 7) goto done;
    Py_ssize_t n = a[0].n, m = a[4].n;
    if (a[1].n != n || a[2].n != n || a[3].n != n || a[5].n != m || a[6].n != m) {
        PyErr_SetString(PyExc_ValueError, "array lengths differ");
        goto done;
    }
    const int64_t *g = a[0].data, *s = a[1].data, *e = a[2].data, *parent = a[3].data;
    const int64_t *qg = a[4].data, *qt = a[5].data;
    int64_t *res = (int64_t *)a[6].view.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t prev = 0;             /* the previous query's answer + 1: every interval before it is at or before it */
    for (Py_ssize_t k = 0; k < m; k++) {
        /* the last interval with (g, s) <= (qg, qt): lo ends one past it */
        Py_ssize_t lo = 0, hi = n;
        if (k > 0 && (qg[k] > qg[k - 1] || (qg[k] == qg[k - 1] && qt[k] >= qt[k - 1]))) {
            /* queries mostly come in time order: gallop forward from the previous answer */
            Py_ssize_t step = 1;
            lo = hi = prev;
            while (hi < n && AT_OR_BEFORE(hi, qg[k], qt[k])) {
                lo = hi + 1;
                hi = lo + step;
                step *= 2;
            }
            if (hi > n) hi = n;
        }
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (AT_OR_BEFORE(mid, qg[k], qt[k])) lo = mid + 1;
            else hi = mid;
        }
        prev = lo;
        int64_t c = (int64_t)lo - 1;
        if (qg[k] < 0 || c < 0 || g[c] != qg[k]) c = -1;
        while (c >= 0 && e[c] <= qt[k]) c = parent[c];
        res[k] = c;
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    release_int64s(a, got);
    return result;
}

static PyMethodDef methods[] = {
    {"parents", parents, METH_VARARGS, "parents(g, s, e, parent) -> conflicts; parent written"},
    {"innermost", innermost, METH_VARARGS, "innermost(g, s, e, parent, qg, qt, out) -> None; out written"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nesting", NULL, -1, methods};

PyMODINIT_FUNC PyInit__nesting(void) { return PyModule_Create(&module); }

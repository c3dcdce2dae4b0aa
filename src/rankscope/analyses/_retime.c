/* The what-if re-timing of one step of the critical path, in one pass (optional; the Python loop
 * of rankscope.analyses.job.critical_path._StepPlan.retime is the reference and the fallback).
 *
 * step(dep, fixed, window, arrival, duration, last_member, link, offsets, members, transfer, last, start,
 *      tail) -> float
 *   n instances in arrival order. Instance k arrives at (the end of instance dep[k] when
 *   dep[k] >= 0, else fixed[k]) + window[k]; until then its arrival is arrival[k]. Instance j ends,
 *   the first time its end is asked for
 *   while `arrived` instances have arrived: at its arrival + duration[j] when last_member[j] >=
 *   arrived (no link, or a member not arrived yet), else at the latest arrival of the members of its
 *   link L = link[j] (members[offsets[L] .. offsets[L + 1])) + transfer[j]; that end is kept. Per rank r: its end is
 *   the end of instance last[r] (asked with all n arrived; start[r] when last[r] < 0) + tail[r].
 *   Returns the longest rank step: the largest rank end - start[r].
 *
 * int64 arrays: dep, last_member, link (-1: none) (n), offsets (links + 1), members (< n, or n: a
 * member outside the step, which never arrives), last (ranks); float64 arrays: fixed, window, arrival,
 * duration, transfer (n), start, tail (ranks); all C-contiguous. Each link's members are listed once,
 * however many instances it links.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_buffer view;
    const void *data;
    Py_ssize_t n;
} Array;

static int get_array(PyObject *obj, Array *out, const char *what, char code) {
    if (PyObject_GetBuffer(obj, &out->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = out->view.format ? out->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = out->view.itemsize == 8 && f[1] == '\0' &&
             (code == 'd' ? *f == 'd' : (*f == 'q' || *f == 'l'));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected a contiguous %s array", what,
                     code == 'd' ? "float64" : "int64");
        PyBuffer_Release(&out->view);
        return -1;
    }
    out->data = out->view.buf;
    out->n = out->view.len / 8;
    return 0;
}

typedef struct {
    const int64_t *last_member, *link, *offsets, *members;
    const double *duration, *transfer;
    double *new_a, *new_e;
    char *has_e;
} Step;

static double end_of(Step *st, Py_ssize_t j, Py_ssize_t arrived) {
    if (st->has_e[j]) return st->new_e[j];
    double v;
    if (st->last_member[j] >= arrived) {
        v = st->new_a[j] + st->duration[j];
    } else {
        int64_t l = st->link[j];
        v = st->new_a[st->members[st->offsets[l]]];
        for (int64_t i = st->offsets[l] + 1; i < st->offsets[l + 1]; i++)
            if (st->new_a[st->members[i]] > v) v = st->new_a[st->members[i]];
        v += st->transfer[j];
    }
    st->has_e[j] = 1;
    st->new_e[j] = v;
    return v;
}

static PyObject *step(PyObject *self, PyObject *args) {
    enum { N_ARGS = 13 };
    PyObject *objs[N_ARGS];
    static const char *names[N_ARGS] = {"dep", "fixed", "window", "arrival", "duration", "last_member", "link",
                                        "offsets", "members", "transfer", "last", "start", "tail"};
    static const char codes[N_ARGS] = {'q', 'd', 'd', 'd', 'd', 'q', 'q', 'q', 'q', 'd', 'q', 'd', 'd'};
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5],
                          &objs[6], &objs[7], &objs[8], &objs[9], &objs[10], &objs[11], &objs[12]))
        return NULL;
    Array a[N_ARGS];
    int got = 0;
    PyObject *result = NULL;
    double *buf = NULL;
    char *has_e = NULL;
    for (; got < N_ARGS; got++)
        if (get_array(objs[got], &a[got], names[got], codes[got]) < 0) goto done;
    Py_ssize_t n = a[0].n, n_links = a[7].n - 1, ranks = a[10].n;
    if (a[1].n != n || a[2].n != n || a[3].n != n || a[4].n != n || a[5].n != n || a[6].n != n || n_links < 0 ||
        a[9].n != n || a[11].n != ranks || a[12].n != ranks || ranks == 0) {
        PyErr_SetString(PyExc_ValueError, "array lengths differ");
        goto done;
    }
    const int64_t *dep = a[0].data, *last_member = a[5].data, *link = a[6].data, *offsets = a[7].data,
                  *members = a[8].data, *last = a[10].data;
    const double *fixed = a[1].data, *window = a[2].data, *arrival = a[3].data, *start = a[11].data,
                 *tail = a[12].data;
    /* every index in range: the pass below reads without checks */
    for (Py_ssize_t l = 0; l < n_links; l++)
        if (offsets[l] < 0 || offsets[l] >= offsets[l + 1] || offsets[l + 1] > a[8].n) {
            PyErr_SetString(PyExc_ValueError, "a link out of range or empty");
            goto done;
        }
    for (Py_ssize_t k = 0; k < n; k++)
        if (dep[k] >= n || link[k] >= n_links || (link[k] < 0 && last_member[k] < n)) {
            PyErr_SetString(PyExc_ValueError, "a dependency or a link out of range");
            goto done;
        }
    for (Py_ssize_t i = 0; i < a[8].n; i++)
        if (members[i] < 0 || members[i] > n) {
            PyErr_SetString(PyExc_ValueError, "a link member out of range");
            goto done;
        }
    for (Py_ssize_t r = 0; r < ranks; r++)
        if (last[r] >= n) {
            PyErr_SetString(PyExc_ValueError, "a rank's last instance out of range");
            goto done;
        }
    buf = malloc(sizeof(double) * (2 * (size_t)n + 2));   /* new_a[n] exists: a member outside the step */
    has_e = calloc((size_t)n + 1, 1);
    if (!buf || !has_e) {
        PyErr_NoMemory();
        goto done;
    }
    Step st = {last_member, link, offsets, members, a[4].data, a[9].data, buf, buf + n + 1, has_e};
    memcpy(buf, arrival, sizeof(double) * (size_t)n);
    buf[n] = 0.0;
    double longest = 0.0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++)
        st.new_a[k] = (dep[k] >= 0 ? end_of(&st, dep[k], k) : fixed[k]) + window[k];
    for (Py_ssize_t r = 0; r < ranks; r++) {
        double e = (last[r] >= 0 ? end_of(&st, last[r], n) : start[r]) + tail[r];
        if (r == 0 || e - start[r] > longest) longest = e - start[r];
    }
    Py_END_ALLOW_THREADS
    result = PyFloat_FromDouble(longest);
done:
    free(buf);
    free(has_e);
    for (int i = 0; i < got; i++) PyBuffer_Release(&a[i].view);
    return result;
}

static PyMethodDef methods[] = {
    {"step", step, METH_VARARGS,
     "step(dep, fixed, window, arrival, duration, last_member, link, offsets, members, transfer, last, start,"
     " tail) -> float"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_retime", NULL, -1, methods};

PyMODINIT_FUNC PyInit__retime(void) { return PyModule_Create(&module); }

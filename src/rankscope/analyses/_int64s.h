/* A contiguous int64 buffer taken from a Python object (a numpy array), shared by the optional C
 * passes of rankscope.analyses (_nesting.c, _intervals.c). */
#ifndef RANKSCOPE_INT64S_H
#define RANKSCOPE_INT64S_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    Py_buffer view;
    int64_t *data;
    Py_ssize_t n;
} Int64s;

/* Fills `out` from `obj` (writable when asked); -1 with a TypeError naming `what` when `obj` is not
 * a C-contiguous int64 buffer. Release with PyBuffer_Release(&out->view). */
static int get_int64s(PyObject *obj, Int64s *out, const char *what, int writable) {
    if (PyObject_GetBuffer(obj, &out->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = out->view.format ? out->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (out->view.itemsize != 8 || !(*f == 'q' || *f == 'l') || f[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s: expected a contiguous int64 array", what);
        PyBuffer_Release(&out->view);
        return -1;
    }
    out->data = (int64_t *)out->view.buf;
    out->n = out->view.len / 8;
    return 0;
}

/* objs[0..n) into a[0..n) (from index first_output on writable). Returns how many were taken: n, or
 * fewer with the exception set; either way release_int64s(a, that many) gives them back. */
static int get_int64s_all(PyObject *const *objs, Int64s *a, const char *const *names, int n, int first_output) {
    for (int got = 0; got < n; got++)
        if (get_int64s(objs[got], &a[got], names[got], got >= first_output) < 0)
            return got;
    return n;
}

static void release_int64s(Int64s *a, int got) {
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&a[i].view);
}

#endif

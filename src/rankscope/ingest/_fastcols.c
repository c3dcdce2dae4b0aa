/*
 * rankscope.ingest._fastcols: turn a list of decoded msgspec Structs into typed column buffers.
 *
 * msgspec parses the JSON (fast, strict, well tested); this module only walks the resulting
 * objects once per column and writes packed C values, which is what pure Python does at
 * ~100 ns per value and this does at a few ns. The pure-Python twin lives in columns.py and
 * defines the contract; tests check that both give identical columns.
 *
 * columnize(objs, specs, indices) -> list[bytes]
 *   objs     list of Struct instances (one per trace event)
 *   specs    sequence of (outer, inner, kind, default, table)
 *              outer   member descriptor of the event Struct (e.g. Event.ts)
 *              inner   member descriptor of the nested Struct (e.g. Args.stream) or None
 *              kind    't' JSON microseconds (int|float) -> int64 nanoseconds
 *                      'f' number -> float64 (default when absent / not a number)
 *                      'i' number -> int64 (floats truncated; digit strings parsed)
 *                      's' str -> int32 code in `table` (dict str -> int, grown here); -1 if not a str
 *                      'k' int, or str -> int64: digit strings parsed, others coded as -2 - code
 *                      'r' any buffer (msgspec.Raw) -> int32 code of its UTF-8 text; -1 otherwise
 *                      'p' list of ints -> int64 product (CUDA grid/block dims); default otherwise
 *              default number used where the value is absent or of another type
 *              table   dict for 's', 'k', 'r' kinds, else None
 *   indices  None (all objects) or a bytes-like of int64 positions into objs
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    PyTypeObject *type;
    Py_ssize_t offset;
    PyObject *name;
} member_t;

static int member_init(PyObject *descr, member_t *m) {
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_SetString(PyExc_TypeError, "columnize: expected a member descriptor");
        return -1;
    }
    PyMemberDescrObject *d = (PyMemberDescrObject *)descr;
    if (d->d_member->type != T_OBJECT_EX && d->d_member->type != T_OBJECT) {
        PyErr_SetString(PyExc_TypeError, "columnize: member is not an object slot");
        return -1;
    }
    m->type = d->d_common.d_type;
    m->offset = d->d_member->offset;
    m->name = d->d_common.d_name;
    return 0;
}

/* Borrowed reference to obj.member or NULL (absent / wrong type); never raises. */
static inline PyObject *member_get(PyObject *obj, const member_t *m) {
    if (obj == NULL || Py_TYPE(obj) != m->type) return NULL;
    return *(PyObject **)((char *)obj + m->offset);
}

static int parse_digits(PyObject *s, long long *out) {
    Py_ssize_t n;
    const char *p = PyUnicode_AsUTF8AndSize(s, &n);
    if (p == NULL) { PyErr_Clear(); return 0; }
    if (n == 0 || n > 18) return 0;
    long long v = 0;
    int neg = 0;
    Py_ssize_t i = 0;
    if (p[0] == '-') { neg = 1; i = 1; if (n == 1) return 0; }
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        v = v * 10 + (p[i] - '0');
    }
    *out = neg ? -v : v;
    return 1;
}

/* Code of `key` in `table`, adding it when new; -1 with an exception set on failure. */
static long long table_code(PyObject *table, PyObject *key) {
    PyObject *code = PyDict_GetItemWithError(table, key);
    if (code != NULL) return PyLong_AsLongLong(code);
    if (PyErr_Occurred()) return -1;
    Py_ssize_t next = PyDict_Size(table);
    PyObject *val = PyLong_FromSsize_t(next);
    if (val == NULL) return -1;
    int rc = PyDict_SetItem(table, key, val);
    Py_DECREF(val);
    return rc < 0 ? -1 : (long long)next;
}

static int as_double(PyObject *v, double *out) {
    if (v == NULL) return 0;
    if (PyFloat_CheckExact(v)) { *out = PyFloat_AS_DOUBLE(v); return 1; }
    if (PyLong_CheckExact(v)) {
        double d = PyLong_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        *out = d;
        return 1;
    }
    return 0;
}

static int as_int64(PyObject *v, long long *out) {
    if (v == NULL) return 0;
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
        *out = x;
        return 1;
    }
    if (PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        if (!isfinite(d) || fabs(d) > 9.2e18) return 0;
        *out = (long long)d;
        return 1;
    }
    if (PyUnicode_CheckExact(v)) return parse_digits(v, out);
    return 0;
}

static PyObject *columnize(PyObject *self, PyObject *args) {
    PyObject *objs, *specs, *indices;
    if (!PyArg_ParseTuple(args, "O!OO", &PyList_Type, &objs, &specs, &indices)) return NULL;

    Py_buffer ibuf = {0};
    const int64_t *idx = NULL;
    Py_ssize_t n = PyList_GET_SIZE(objs);
    if (indices != Py_None) {
        if (PyObject_GetBuffer(indices, &ibuf, PyBUF_SIMPLE) < 0) return NULL;
        idx = (const int64_t *)ibuf.buf;
        n = ibuf.len / (Py_ssize_t)sizeof(int64_t);
        Py_ssize_t total = PyList_GET_SIZE(objs);
        for (Py_ssize_t j = 0; j < n; j++) {
            if (idx[j] < 0 || idx[j] >= total) {
                PyBuffer_Release(&ibuf);
                PyErr_SetString(PyExc_IndexError, "columnize: index out of range");
                return NULL;
            }
        }
    }

    PyObject *seq = PySequence_Fast(specs, "columnize: specs must be a sequence");
    if (seq == NULL) goto fail_buf;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = PyList_New(ncols);
    if (result == NULL) goto fail_seq;

    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *spec = PySequence_Fast_GET_ITEM(seq, c);
        PyObject *outer_d, *inner_d, *deflt, *table;
        const char *kind;
        if (!PyArg_ParseTuple(spec, "OOsOO", &outer_d, &inner_d, &kind, &deflt, &table)) goto fail_all;
        member_t outer, inner;
        int nested = inner_d != Py_None;
        if (member_init(outer_d, &outer) < 0) goto fail_all;
        if (nested && member_init(inner_d, &inner) < 0) goto fail_all;
        char k = kind[0];
        int needs_table = (k == 's' || k == 'k' || k == 'r');
        if (needs_table && !PyDict_Check(table)) {
            PyErr_SetString(PyExc_TypeError, "columnize: kinds s, k and r need a dict table");
            goto fail_all;
        }
        size_t item = (k == 's' || k == 'r') ? 4 : 8;
        PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * item));
        if (out == NULL) goto fail_all;
        PyList_SET_ITEM(result, c, out);
        char *buf = PyBytes_AS_STRING(out);
        double dflt_f = 0.0;
        long long dflt_i = 0;
        if (deflt != Py_None) {
            dflt_f = PyFloat_AsDouble(deflt);
            if (PyErr_Occurred()) goto fail_all;
            if (PyLong_Check(deflt)) {
                dflt_i = PyLong_AsLongLong(deflt);
                if (PyErr_Occurred()) goto fail_all;
            } else {
                dflt_i = (long long)dflt_f;
            }
        }

        for (Py_ssize_t j = 0; j < n; j++) {
            PyObject *obj = PyList_GET_ITEM(objs, idx ? (Py_ssize_t)idx[j] : j);
            PyObject *v = member_get(obj, &outer);
            if (nested) v = member_get(v, &inner);
            switch (k) {
            case 't': {
                long long ns = dflt_i;
                if (v != NULL && PyLong_CheckExact(v)) {
                    int overflow = 0;
                    long long us = PyLong_AsLongLongAndOverflow(v, &overflow);
                    if (!overflow && !(us == -1 && PyErr_Occurred()) && llabs(us) < 9000000000000000LL)
                        ns = us * 1000;
                    PyErr_Clear();
                } else if (v != NULL && PyFloat_CheckExact(v)) {
                    double d = PyFloat_AS_DOUBLE(v) * 1000.0;
                    if (isfinite(d) && fabs(d) < 9.2e18) ns = llround(d);
                }
                ((int64_t *)buf)[j] = ns;
                break;
            }
            case 'f': {
                double d;
                ((double *)buf)[j] = as_double(v, &d) ? d : dflt_f;
                break;
            }
            case 'i': {
                long long x;
                ((int64_t *)buf)[j] = as_int64(v, &x) ? x : dflt_i;
                break;
            }
            case 'k': {
                long long x;
                if (v != NULL && PyLong_CheckExact(v) && as_int64(v, &x)) {
                    ((int64_t *)buf)[j] = x;
                } else if (v != NULL && PyUnicode_CheckExact(v)) {
                    if (parse_digits(v, &x)) {
                        ((int64_t *)buf)[j] = x;
                    } else {
                        long long code = table_code(table, v);
                        if (code < 0) goto fail_all;
                        ((int64_t *)buf)[j] = -2 - code;
                    }
                } else {
                    ((int64_t *)buf)[j] = dflt_i;
                }
                break;
            }
            case 's': {
                long long code = -1;
                if (v != NULL && PyUnicode_CheckExact(v)) {
                    code = table_code(table, v);
                    if (code < 0) goto fail_all;
                }
                ((int32_t *)buf)[j] = (int32_t)code;
                break;
            }
            case 'r': {
                long long code = -1;
                if (v != NULL && PyObject_CheckBuffer(v)) {
                    Py_buffer rb;
                    if (PyObject_GetBuffer(v, &rb, PyBUF_SIMPLE) < 0) goto fail_all;
                    PyObject *text = PyUnicode_DecodeUTF8((const char *)rb.buf, rb.len, "replace");
                    PyBuffer_Release(&rb);
                    if (text == NULL) goto fail_all;
                    code = table_code(table, text);
                    Py_DECREF(text);
                    if (code < 0) goto fail_all;
                }
                ((int32_t *)buf)[j] = (int32_t)code;
                break;
            }
            case 'p': {
                long long prod = dflt_i;
                if (v != NULL && PyList_CheckExact(v) && PyList_GET_SIZE(v) > 0) {
                    long long acc = 1, x;
                    Py_ssize_t m = PyList_GET_SIZE(v), i;
                    for (i = 0; i < m; i++) {
                        if (!as_int64(PyList_GET_ITEM(v, i), &x)) break;
                        acc *= x;
                    }
                    if (i == m) prod = acc;
                }
                ((int64_t *)buf)[j] = prod;
                break;
            }
            default:
                PyErr_Format(PyExc_ValueError, "columnize: unknown kind %c", k);
                goto fail_all;
            }
        }
    }
    Py_DECREF(seq);
    if (idx) PyBuffer_Release(&ibuf);
    return result;

fail_all:
    Py_DECREF(result);
fail_seq:
    Py_DECREF(seq);
fail_buf:
    if (idx) PyBuffer_Release(&ibuf);
    return NULL;
}

static PyMethodDef methods[] = {
    {"columnize", columnize, METH_VARARGS, "Extract typed column buffers from a list of Structs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_fastcols", "Column extraction for rankscope ingest.", -1, methods,
};

PyMODINIT_FUNC PyInit__fastcols(void) { return PyModule_Create(&moduledef); }

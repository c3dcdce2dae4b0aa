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
 *              kind    't' JSON microseconds (int, float, Decimal) -> int64 nanoseconds, saturated at
 *                      +-T_MAX; NaN or another type -> T_NOT_A_NUMBER (absent: default)
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
#include <limits.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <stdlib.h>

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

#define T_NOT_A_NUMBER LLONG_MIN     /* kind 't': a value that is not a number (columns.py) */
#define T_MAX LLONG_MAX               /* kind 't': magnitudes beyond int64 nanoseconds saturate here */

static inline long long saturated(int negative) { return negative ? -T_MAX : T_MAX; }

/* True/false from a no-argument method of v; -1 with an exception set. */
static int call_bool(PyObject *v, const char *method) {
    PyObject *r = PyObject_CallMethod(v, method, NULL);
    if (r == NULL) return -1;
    int out = PyObject_IsTrue(r);
    Py_DECREF(r);
    return out;
}

/* Kind 't' (see columns.py): absent -> `dflt`; an int, float or decimal.Decimal (the exact text of
   a JSON number) of microseconds -> round(v * 1000) ns, half to even, saturated at +-T_MAX; NaN or
   any other type -> T_NOT_A_NUMBER. */
static long long time_ns(PyObject *v, long long dflt) {
    static PyObject *decimal_type = NULL;
    if (v == NULL || v == Py_None) return dflt;
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long us = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) return saturated(overflow < 0);
        if (us > T_MAX / 1000 || us < -(T_MAX / 1000)) return saturated(us < 0);
        return us * 1000;
    }
    if (PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        if (isnan(d)) return T_NOT_A_NUMBER;
        d *= 1000.0;
        return fabs(d) < 9.2e18 ? (long long)nearbyint(d) : saturated(d < 0);   /* half to even */
    }
    if (decimal_type == NULL) {
        PyObject *mod = PyImport_ImportModule("decimal");
        decimal_type = mod ? PyObject_GetAttrString(mod, "Decimal") : NULL;
        Py_XDECREF(mod);
        if (decimal_type == NULL) { PyErr_Clear(); return T_NOT_A_NUMBER; }
    }
    if (PyObject_IsInstance(v, decimal_type) != 1) { PyErr_Clear(); return T_NOT_A_NUMBER; }
    long long ns = T_NOT_A_NUMBER;
    int nan = call_bool(v, "is_nan"), negative = call_bool(v, "is_signed"), infinite = call_bool(v, "is_infinite");
    PyObject *adjusted = (nan == 0 && infinite == 0) ? PyObject_CallMethod(v, "adjusted", NULL) : NULL;
    long exponent = adjusted ? PyLong_AsLong(adjusted) : 0;
    Py_XDECREF(adjusted);
    if (nan != 0 || negative < 0 || infinite < 0 || PyErr_Occurred()) {
        ns = T_NOT_A_NUMBER;
    } else if (infinite || exponent >= 19) {       /* |v| >= 1e19 us: far beyond int64 ns */
        ns = saturated(negative);
    } else {
        PyObject *thousand = PyLong_FromLong(1000);
        PyObject *scaled = thousand ? PyNumber_Multiply(v, thousand) : NULL;
        PyObject *rounded = scaled ? PyObject_CallMethod(scaled, "__round__", NULL) : NULL;
        int overflow = 0;
        long long x = rounded ? PyLong_AsLongLongAndOverflow(rounded, &overflow) : 0;
        if (rounded != NULL && !PyErr_Occurred())
            ns = (overflow || x < -T_MAX) ? saturated(negative) : x;
        Py_XDECREF(thousand); Py_XDECREF(scaled); Py_XDECREF(rounded);
    }
    PyErr_Clear();
    return ns;
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
            case 't':
                ((int64_t *)buf)[j] = time_ns(v, dflt_i);
                break;
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
                        PyObject *item = PyList_GET_ITEM(v, i);
                        if (!PyLong_CheckExact(item) || !as_int64(item, &x)) break;    /* ints only */
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


/* ============================================================================================
 * scan_events(buf, specs, tables) -> (columns, n_events, n_bad) | int error_offset
 *
 * The fast path of the Kineto reader: walks a JSON array of trace events in C and writes the
 * same columns that `msgspec decode + columnize` would (same kinds, same tables), without
 * creating a Python object per event. Anything it is not sure about (invalid JSON, invalid
 * UTF-8, nesting deeper than 64) returns the byte offset of the problem as an int, and the
 * caller takes the msgspec path for that chunk, which is the reference behaviour.
 *
 *   buf     bytes-like holding "[ {event}, {event}, ... ]"
 *   specs   sequence of (outer_key, inner_key_or_None, kind, default, table_index)
 *           outer_key is a top-level event key ("ts"); inner_key a key of its "args" object
 *   tables  list of dicts shared with the msgspec path (str -> code)
 *   state   optional: scan_state(len(tables)), kept by the caller across the calls of one file:
 *           string caches (a string met in an earlier chunk is coded without the GIL or a Python
 *           object; valid while the tables only grow) and column buffers reused from call to
 *           call. Without it, each call starts empty.
 *   routing optional, with a state: split the rows into the groups the reader keeps (see route_block)
 * ========================================================================================== */

#define MAX_DEPTH 64

typedef struct {
    const char *p;
    const char *end;
    int error;
    PyThreadState *released;   /* non-NULL while the scan runs without the GIL */
} parser_t;

/* The scan runs without the GIL (ranks parse in parallel threads); the rare steps that touch
   Python objects take it back for their duration. */
#define WITH_GIL(ps) PyThreadState *saved_ = (ps)->released; if (saved_) PyEval_RestoreThread(saved_)
#define END_GIL(ps) if (saved_) (ps)->released = PyEval_SaveThread()

typedef struct {           /* one slot: together, so a lookup touches one cache line */
    const char *key;
    Py_ssize_t len;
    uint64_t hash;
    int64_t code;
} strslot_t;

typedef struct arena_block {   /* storage for the key bytes of a persistent string cache */
    struct arena_block *next;
    size_t used, cap;
    char data[];
} arena_block_t;

typedef struct {           /* a string cache: raw JSON string bytes -> code */
    strslot_t *slots;
    Py_ssize_t cap, used;
    PyObject *table;       /* the Python dict shared across calls */
    int persistent;        /* 1: outlives the scan call (keys copied into `arena`); 0: this call only
                              (keys point into the scanned buffer) */
    arena_block_t *arena;
} strcache_t;

/* A copy of s[0:n] that lives as long as the cache; NULL when out of memory. */
static const char *arena_copy(strcache_t *c, const char *s, Py_ssize_t n) {
    arena_block_t *b = c->arena;
    if (b == NULL || b->cap - b->used < (size_t)n) {
        size_t cap = (size_t)n > ((size_t)1 << 16) ? (size_t)n : ((size_t)1 << 16);
        b = malloc(sizeof(arena_block_t) + cap);
        if (b == NULL) return NULL;
        b->next = c->arena; b->used = 0; b->cap = cap;
        c->arena = b;
    }
    char *out = b->data + b->used;
    memcpy(out, s, (size_t)n);
    b->used += (size_t)n;
    return out;
}

typedef struct {
    char kind;
    int inner;             /* 1: key inside "args" */
    double dflt_f;
    long long dflt_i;
    strcache_t *cache;
    const char *last_s;    /* the string this column coded last (consecutive events repeat their */
    Py_ssize_t last_n;     /* ph, cat, pid, tid, often their name): checked before the cache */
    int last_esc;
    long long last_code;
    char *data;            /* the column's rows (a scratch buffer, see scratch_t) */
    size_t item;
} column_t;

#define KEYMAP_CAP 256
/* Room for keys met in the text that no column wants (remembered so that they are predicted
   too); past it, such keys are looked up and skipped each time. */
#define KEYMAP_UNWANTED_MAX 128
typedef struct {           /* key bytes -> up to 4 column indices */
    const char *key[KEYMAP_CAP];
    Py_ssize_t len[KEYMAP_CAP];
    int cols[KEYMAP_CAP][4];
    int ncols[KEYMAP_CAP];
    /* Events repeat their keys in the same order: next[s] is the slot of the key that followed
       slot s last time (next[KEYMAP_CAP]: the first key of an object), checked before hashing. */
    int next[KEYMAP_CAP + 1];
    int unwanted;
} keymap_t;

static void keymap_init(keymap_t *m) {
    for (int i = 0; i <= KEYMAP_CAP; i++) m->next[i] = -1;
}

static inline uint64_t load8(const char *s) {
    uint64_t w;
    memcpy(&w, s, 8);
    return w;
}

/* String hash for the string caches: length and three 8-byte windows (start, middle, end), so
   its cost does not grow with the string; equal hashes are confirmed byte by byte. s[0:n] lies in
   a buffer that ends at `end`: a short string is read as one masked word when 8 bytes fit. */
static uint64_t hash_bytes(const char *s, Py_ssize_t n, const char *end) {
    uint64_t a = 0, b = 0, c = 0;
    if (n >= 8) {
        a = load8(s);
        b = load8(s + n - 8);
        c = load8(s + n / 2 - 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    } else if (end - s >= 8) {
        a = load8(s) & ((1ULL << (8 * n)) - 1);       /* the low bytes are s[0:n] */
#endif
    } else {
        memcpy(&a, s, (size_t)n);
    }
    uint64_t h = (a ^ 0x9E3779B97F4A7C15ULL) * 0xBF58476D1CE4E5B9ULL;
    h = (h ^ (h >> 31) ^ b) * 0x94D049BB133111EBULL;
    h = (h ^ (h >> 29) ^ c ^ ((uint64_t)n << 48)) * 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 32);
}

/* a == b over n bytes, inlined: keys and names are short, where a call to memcmp costs more than
   the comparison. */
static inline int bytes_equal(const char *a, const char *b, Py_ssize_t n) {
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y) return 0;
    }
    for (; n > 0; a++, b++, n--)
        if (*a != *b) return 0;
    return 1;
}

/* At ps->p: '"', the n bytes of `text` (which holds no backslash or quote) and '"'. */
static inline int quoted_text_at(const parser_t *ps, const char *text, Py_ssize_t n) {
    const char *p = ps->p;
    return ps->end - p > n + 1 && p[0] == '"' && p[n + 1] == '"' && bytes_equal(p + 1, text, n);
}

/* Keys are short and few: length and three bytes spread them well enough; bytes_equal decides. */
static inline uint64_t key_hash(const char *k, Py_ssize_t n) {
    if (n == 0) return 0;
    return (uint64_t)n * 0x9E3779B1u ^ ((uint64_t)(unsigned char)k[0] << 8) ^
           ((uint64_t)(unsigned char)k[n - 1] << 16) ^ ((uint64_t)(unsigned char)k[n / 2] * 0x45d9f3bu);
}

/* Slot of key k: found, or added (empty, with no column) when `add` (then *added = 1); -1 when
   absent and not added. */
static int keymap_slot(keymap_t *m, const char *k, Py_ssize_t n, int add, int *added) {
    uint64_t h = key_hash(k, n);
    for (Py_ssize_t i = 0; i < KEYMAP_CAP; i++) {
        Py_ssize_t j = (Py_ssize_t)((h + (uint64_t)i) % KEYMAP_CAP);
        if (m->key[j] == NULL) {
            if (!add) return -1;
            m->key[j] = k; m->len[j] = n; m->ncols[j] = 0;
            *added = 1;
            return (int)j;
        }
        if (m->len[j] == n && bytes_equal(m->key[j], k, n)) return (int)j;
    }
    return -1;
}

static void keymap_add(keymap_t *m, const char *k, Py_ssize_t n, int col) {
    int added = 0, j = keymap_slot(m, k, n, 1, &added);
    if (j >= 0 && m->ncols[j] < 4) m->cols[j][m->ncols[j]++] = col;
}

/* Slot of a key that followed slot `prev` (KEYMAP_CAP: an object's first key) where the
   prediction missed: looked up, and predicted after `prev` from now on; a key no column wants is
   remembered while there is room (the key bytes live in the scanned buffer, which outlives the
   map). -1: not in the map. */
static int keymap_learn(keymap_t *m, int prev, const char *k, Py_ssize_t n) {
    int added = 0;
    int j = keymap_slot(m, k, n, m->unwanted < KEYMAP_UNWANTED_MAX, &added);
    m->unwanted += added;
    if (j >= 0) m->next[prev] = j;
    return j;
}

static inline int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static inline int ends_value(char c) { return c == ',' || c == '}' || c == ']' || is_ws(c); }

/* Pretty-printed traces are a quarter whitespace: skip it 16 bytes at a time where SSE2 exists. */
static inline void skip_ws(parser_t *ps) {
    const char *p = ps->p, *end = ps->end;
    if (p < end && !is_ws(*p)) return;
    if (p + 1 < end && *p == ' ' && !is_ws(p[1])) { ps->p = p + 1; return; }   /* ", " and ": " */
#ifdef __SSE2__
    const __m128i sp = _mm_set1_epi8(' '), nl = _mm_set1_epi8('\n'), cr = _mm_set1_epi8('\r'),
                  tb = _mm_set1_epi8('\t');
    while (p + 16 <= end) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i ws = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, sp), _mm_cmpeq_epi8(v, nl)),
                                  _mm_or_si128(_mm_cmpeq_epi8(v, cr), _mm_cmpeq_epi8(v, tb)));
        unsigned mask = (unsigned)_mm_movemask_epi8(ws) ^ 0xFFFFu;
        if (mask) { ps->p = p + __builtin_ctz(mask); return; }
        p += 16;
    }
#endif
    while (p < end && is_ws(*p)) p++;
    ps->p = p;
}

/* First '"' or '\\' in [p, end), or NULL: one pass (16 bytes at a time where SSE2 exists) instead
   of a memchr for each, which costs more than the search on the short strings of a trace. */
static inline const char *find_quote_or_backslash(const char *p, const char *end) {
    for (const char *stop = p + 8 < end ? p + 8 : end; p < stop; p++)      /* short keys, short values */
        if (*p == '"' || *p == '\\') return p;
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    while (p + 16 <= end) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        unsigned mask = (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                                                 _mm_cmpeq_epi8(v, backslash)));
        if (mask) return p + __builtin_ctz(mask);
        p += 16;
    }
#endif
    for (; p < end; p++)
        if (*p == '"' || *p == '\\') return p;
    return NULL;
}

/* At a '"': advance past the string. Sets *s,*n to the raw content, *esc if it has escapes.
   (Raw control characters inside strings are accepted: lenient where JSON is strict.) */
static int scan_string(parser_t *ps, const char **s, Py_ssize_t *n, int *esc) {
    const char *p = ps->p + 1;
    *esc = 0;
    *s = p;
    for (;;) {
        const char *q = find_quote_or_backslash(p, ps->end);
        if (q == NULL) break;
        if (*q == '"') { *n = q - *s; ps->p = q + 1; return 0; }
        *esc = 1;
        p = q + 2;                    /* skip the escaped character (it may be a quote) */
        if (p > ps->end) break;
    }
    ps->error = 1;
    ps->p = ps->end;                  /* unterminated: the text breaks at its end */
    return -1;
}

typedef enum { V_NONE, V_INT, V_FLOAT, V_STR, V_NULL, V_BOOL, V_ARRAY, V_OBJECT, V_BIGINT } vtype_t;

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number at ps->p: *t = V_INT (fits int64), V_BIGINT (integer too large) or V_FLOAT. */
static int scan_number(parser_t *ps, vtype_t *t, long long *iv, double *dv) {
    const char *p = ps->p, *start = p;
    int neg = 0, is_float = 0;
    unsigned long long mant = 0;
    int digits = 0, frac_digits = 0, overflow = 0;
    if (p < ps->end && *p == '-') { neg = 1; p++; }
    if (p >= ps->end) goto bad;
    if (*p == '0') { p++; digits = 1; }
    else if (*p >= '1' && *p <= '9') {
        while (p < ps->end && *p >= '0' && *p <= '9') {
            if (mant > (ULLONG_MAX - 9) / 10) overflow = 1; else mant = mant * 10 + (unsigned)(*p - '0');
            digits++; p++;
        }
    } else goto bad;
    if (p < ps->end && *p == '.') {
        is_float = 1; p++;
        if (p >= ps->end || *p < '0' || *p > '9') goto bad;
        while (p < ps->end && *p >= '0' && *p <= '9') {
            if (mant > (ULLONG_MAX - 9) / 10) overflow = 1; else mant = mant * 10 + (unsigned)(*p - '0');
            digits++; frac_digits++; p++;
        }
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        is_float = 1; p++;
        if (p < ps->end && (*p == '+' || *p == '-')) p++;
        if (p >= ps->end || *p < '0' || *p > '9') goto bad;
        while (p < ps->end && *p >= '0' && *p <= '9') p++;
        overflow = 1;                 /* exponent: always take the exact slow path */
    }
    ps->p = p;
    if (!is_float) {
        if (overflow || mant > (unsigned long long)LLONG_MAX + (unsigned long long)neg) { *t = V_BIGINT; return 0; }
        *iv = neg ? (long long)(0 - mant) : (long long)mant;
        *t = V_INT;
        return 0;
    }
    *t = V_FLOAT;
    if (!overflow && mant < (1ULL << 53) && frac_digits <= 22) {
        /* exact: both operands representable, one correctly rounded division (Clinger) */
        double d = (double)mant / POW10[frac_digits];
        *dv = neg ? -d : d;
        return 0;
    }
    {
        char tmp[400];
        Py_ssize_t len = p - start;
        if (len >= (Py_ssize_t)sizeof(tmp)) { *dv = neg ? -HUGE_VAL : HUGE_VAL; return 0; }
        memcpy(tmp, start, (size_t)len);
        tmp[len] = 0;
        WITH_GIL(ps);
        *dv = PyOS_string_to_double(tmp, NULL, NULL);
        if (*dv == -1.0 && PyErr_Occurred()) { PyErr_Clear(); *dv = neg ? -HUGE_VAL : HUGE_VAL; }
        END_GIL(ps);
        return 0;
    }
bad:
    ps->error = 1;
    return -1;
}

static int skip_value(parser_t *ps, int depth);

/* At an object member: `"key"`, whitespace, ':', whitespace. */
static int scan_key(parser_t *ps, const char **key, Py_ssize_t *n, int *esc) {
    if (ps->p >= ps->end || *ps->p != '"' || scan_string(ps, key, n, esc) < 0) { ps->error = 1; return -1; }
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != ':') { ps->error = 1; return -1; }
    ps->p++;
    skip_ws(ps);
    return 0;
}

static int skip_container(parser_t *ps, int depth, char close) {
    if (depth > MAX_DEPTH) { ps->error = 1; return -1; }
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) { ps->p++; return 0; }
    while (ps->p < ps->end) {
        if (close == '}') {
            const char *s; Py_ssize_t n; int esc;
            if (scan_key(ps, &s, &n, &esc) < 0) return -1;
        }
        if (skip_value(ps, depth + 1) < 0) return -1;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; skip_ws(ps); continue; }
        if (ps->p < ps->end && *ps->p == close) { ps->p++; return 0; }
        break;
    }
    ps->error = 1;
    return -1;
}

static int scan_literal(parser_t *ps, const char *lit, Py_ssize_t n) {
    if (ps->end - ps->p >= n && memcmp(ps->p, lit, (size_t)n) == 0) { ps->p += n; return 0; }
    ps->error = 1;
    return -1;
}

static int skip_value(parser_t *ps, int depth) {
    if (ps->p >= ps->end) { ps->error = 1; return -1; }
    char c = *ps->p;
    if (c == '"') { const char *s; Py_ssize_t n; int esc; return scan_string(ps, &s, &n, &esc); }
    if (c == '{') return skip_container(ps, depth, '}');
    if (c == '[') return skip_container(ps, depth, ']');
    if (c == 't') return scan_literal(ps, "true", 4);
    if (c == 'f') return scan_literal(ps, "false", 5);
    if (c == 'n') return scan_literal(ps, "null", 4);
    vtype_t t; long long iv; double dv;
    return scan_number(ps, &t, &iv, &dv);
}

/* Unescaped str object for raw JSON string content (NULL + exception on invalid text). */
static PyObject *string_object(const char *s, Py_ssize_t n, int esc) {
    if (!esc) return PyUnicode_DecodeUTF8(s, n, "strict");
    /* rare: let the json module unescape exactly as JSON defines it */
    PyObject *quoted = PyBytes_FromStringAndSize(NULL, n + 2);
    if (quoted == NULL) return NULL;
    char *q = PyBytes_AS_STRING(quoted);
    q[0] = '"'; memcpy(q + 1, s, (size_t)n); q[n + 1] = '"';
    PyObject *json = PyImport_ImportModule("json");
    PyObject *out = json ? PyObject_CallMethod(json, "loads", "O", quoted) : NULL;
    Py_XDECREF(json);
    Py_DECREF(quoted);
    if (out != NULL && !PyUnicode_CheckExact(out)) { Py_DECREF(out); PyErr_SetString(PyExc_ValueError, "bad string"); return NULL; }
    return out;
}

/* Code of a raw string in a cache/table; -1 with exception on failure. */
static long long cache_lookup(parser_t *ps, strcache_t *c, const char *s, Py_ssize_t n, int esc);

/* Code of a column's raw string, from its table's cache; remembered as the column's last string,
   which store_value compares in place first. */
static inline long long cache_code(parser_t *ps, column_t *col, const char *s, Py_ssize_t n, int esc) {
    long long code = cache_lookup(ps, col->cache, s, n, esc);
    if (code >= 0) {
        col->last_s = s; col->last_n = n; col->last_esc = esc; col->last_code = code;
    }
    return code;
}

static long long cache_lookup(parser_t *ps, strcache_t *c, const char *s, Py_ssize_t n, int esc) {
    uint64_t h = hash_bytes(s, n, ps->end) ^ (uint64_t)esc;
    if (c->used * 2 >= c->cap) {
        Py_ssize_t ncap = c->cap ? c->cap * 2 : 1024;
        strslot_t *grown = calloc((size_t)ncap, sizeof(strslot_t));
        if (grown == NULL) {
            WITH_GIL(ps);
            PyErr_NoMemory();
            END_GIL(ps);
            return -1;
        }
        for (Py_ssize_t i = 0; i < c->cap; i++) {
            if (c->slots[i].key == NULL) continue;
            Py_ssize_t j = (Py_ssize_t)(c->slots[i].hash & (uint64_t)(ncap - 1));
            while (grown[j].key != NULL) j = (j + 1) & (ncap - 1);
            grown[j] = c->slots[i];
        }
        free(c->slots);
        c->slots = grown;
        c->cap = ncap;
    }
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(c->cap - 1));     /* cap is a power of two */
    while (c->slots[j].key != NULL) {
        const strslot_t *slot = &c->slots[j];
        if (slot->hash == h && slot->len == n && bytes_equal(slot->key, s, n)) return slot->code;
        j = (j + 1) & (c->cap - 1);
    }
    WITH_GIL(ps);
    PyObject *text = string_object(s, n, esc);
    long long code = -1;
    if (text != NULL) {
        code = table_code(c->table, text);
        Py_DECREF(text);
    }
    END_GIL(ps);
    if (code < 0) return -1;
    const char *key = c->persistent ? arena_copy(c, s, n) : s;
    if (key == NULL) return code;          /* out of memory for the copy: coded, not remembered */
    c->slots[j] = (strslot_t){key, n, h, code};
    c->used++;
    return code;
}

static void cache_free(strcache_t *c) {
    free(c->slots);
    c->slots = NULL;
    c->cap = c->used = 0;
    while (c->arena != NULL) {
        arena_block_t *next = c->arena->next;
        free(c->arena);
        c->arena = next;
    }
}

/* The scanned columns' buffers: reused from chunk to chunk of a file (no page faults, no malloc
   churn), or for one call. */
typedef struct {
    Py_ssize_t ncols;
    char **data;
    size_t *bytes;         /* capacity of each */
} scratch_t;

static void scratch_free(scratch_t *s) {
    for (Py_ssize_t c = 0; c < s->ncols; c++) free(s->data[c]);
    free(s->data);
    free(s->bytes);
    memset(s, 0, sizeof(*s));
}

/* ncols empty buffers (kept when there are that many already); -1 when out of memory. */
static int scratch_ready(scratch_t *s, Py_ssize_t ncols) {
    if (s->ncols == ncols && s->data != NULL) return 0;
    scratch_free(s);
    s->data = calloc((size_t)(ncols ? ncols : 1), sizeof(char *));
    s->bytes = calloc((size_t)(ncols ? ncols : 1), sizeof(size_t));
    if (s->data == NULL || s->bytes == NULL) { scratch_free(s); return -1; }
    s->ncols = ncols;
    return 0;
}

/* ---- what persists across the scan calls of one file: string caches, column buffers ---- */
#define STATE_CAPSULE "rankscope.ingest._fastcols.scan_state"

typedef struct routed routed_t;
static void routed_free(routed_t *R);

typedef struct {
    scratch_t scratch;
    routed_t *routed;      /* the routing's output buffers (allocated on first use) */
    Py_ssize_t n;
    strcache_t caches[];
} scanstate_t;

static void scanstate_destroy(PyObject *capsule) {
    scanstate_t *st = PyCapsule_GetPointer(capsule, STATE_CAPSULE);
    if (st == NULL) { PyErr_Clear(); return; }
    for (Py_ssize_t t = 0; t < st->n; t++) cache_free(&st->caches[t]);
    scratch_free(&st->scratch);
    if (st->routed) {
        routed_free(st->routed);
        free(st->routed);
    }
    free(st);
}

static PyObject *scan_state(PyObject *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "scan_state: need a count of tables >= 0");
        return NULL;
    }
    scanstate_t *st = calloc(1, sizeof(scanstate_t) + (size_t)n * sizeof(strcache_t));
    if (st == NULL) return PyErr_NoMemory();
    st->n = n;
    for (Py_ssize_t t = 0; t < n; t++) st->caches[t].persistent = 1;
    PyObject *capsule = PyCapsule_New(st, STATE_CAPSULE, scanstate_destroy);
    if (capsule == NULL) free(st);
    return capsule;
}


/* Exact decimal microseconds -> int64 nanoseconds, rounded half to even (what Decimal(text) *
   1000 rounded gives). Returns 0 ok, 1 "not handled here" (exponent, too large: the caller
   declines the chunk and the Decimal-based path decides), -1 syntax error. *stop = end of the
   number. */
static int decimal_us_to_ns(const char *p, const char *end, const char **stop, long long *out) {
    int neg = 0;
    unsigned long long whole = 0;
    long long frac = 0;
    int nfrac = 0, round_digit = -1, sticky = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    if (p >= end) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') {
            if (whole > 9000000000000000ULL / 10) return 1;
            whole = whole * 10 + (unsigned)(*p - '0');
            p++;
        }
    } else return -1;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') {
            int d = *p - '0';
            if (nfrac < 3) { frac = frac * 10 + d; nfrac++; }
            else if (round_digit < 0) round_digit = d;
            else if (d) sticky = 1;
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) return 1;
    *stop = p;
    while (nfrac < 3) { frac *= 10; nfrac++; }
    if (whole > 9000000000000000ULL) return 1;
    long long ns = (long long)whole * 1000 + frac;
    if (round_digit > 5 || (round_digit == 5 && (sticky || (ns & 1)))) ns++;
    *out = neg ? -ns : ns;
    return 0;
}

/* Parse the value at ps->p and store it into column `col` at row `row`. -1: error (ps->error set
   for a syntax error, or a Python exception set). */
static void set_default(column_t *col, Py_ssize_t row);

static int store_value(parser_t *ps, column_t *col, Py_ssize_t row) {
    char c = ps->p < ps->end ? *ps->p : 0;
    char k = col->kind;
    set_default(col, row);          /* a repeated key: the last value wins, as in a decoder */
    if (k == 't' && c != '"' && c != '-' && (c < '0' || c > '9')) {
        ps->error = 1;              /* ts/dur that is not a number: the reference path decides */
        return -1;
    }
    if (k == 'r') {
        /* the column's last value again: same bytes, so the value ends where it ended (a number
           could go on: a delimiter must follow) */
        if (col->last_s != NULL && ps->end - ps->p > col->last_n &&
            bytes_equal(ps->p, col->last_s, col->last_n) && ends_value(ps->p[col->last_n])) {
            ((int32_t *)col->data)[row] = (int32_t)col->last_code;
            ps->p += col->last_n;
            return 0;
        }
        const char *start = ps->p;
        if (skip_value(ps, 1) < 0) return -1;
        long long code = cache_code(ps, col, start, ps->p - start, 0);
        if (code < 0) return -1;
        ((int32_t *)col->data)[row] = (int32_t)code;
        return 0;
    }
    if (k == 't' && (c == '-' || (c >= '0' && c <= '9'))) {
        const char *stop;
        long long ns;
        int rc = decimal_us_to_ns(ps->p, ps->end, &stop, &ns);
        if (rc != 0) { ps->error = 1; return -1; }     /* syntax error, or the Decimal path decides */
        ps->p = stop;
        ((int64_t *)col->data)[row] = ns;
        return 0;
    }
    if (c == '"' && (k == 's' || k == 'k') && col->last_s != NULL && !col->last_esc &&
        quoted_text_at(ps, col->last_s, col->last_n)) {
        /* the column's last string again (no escapes in it, so the quote after it closes it) */
        if (k == 's') ((int32_t *)col->data)[row] = (int32_t)col->last_code;
        else ((int64_t *)col->data)[row] = -2 - col->last_code;
        ps->p += col->last_n + 2;
        return 0;
    }
    if (c == '"') {
        const char *s; Py_ssize_t n; int esc;
        if (scan_string(ps, &s, &n, &esc) < 0) return -1;
        if (k == 't') {      /* a decimal in a string: accepted like a number, else declined */
            const char *stop;
            long long ns;
            if (esc || decimal_us_to_ns(s, s + n, &stop, &ns) != 0 || stop != s + n) { ps->error = 1; return -1; }
            ((int64_t *)col->data)[row] = ns;
            return 0;
        }
        if (k == 's' || k == 'k' || k == 'i') {
            if (k != 's' && !esc && n > 0 && n <= 18) {
                Py_ssize_t i = (s[0] == '-') ? 1 : 0;
                long long v = 0;
                int ok = i < n;
                for (; i < n && ok; i++) {
                    if (s[i] < '0' || s[i] > '9') ok = 0; else v = v * 10 + (s[i] - '0');
                }
                if (ok) { ((int64_t *)col->data)[row] = s[0] == '-' ? -v : v; return 0; }
            }
            if (k == 'i') {
                if (esc) {   /* an escaped digit string is possible in theory: decode and retry */
                    WITH_GIL(ps);
                    PyObject *o = string_object(s, n, esc);
                    long long v;
                    if (o != NULL && parse_digits(o, &v)) ((int64_t *)col->data)[row] = v;
                    Py_XDECREF(o);
                    END_GIL(ps);
                    if (o == NULL) return -1;
                }
                return 0;
            }
            if (k == 'k' && esc) {
                WITH_GIL(ps);
                PyObject *o = string_object(s, n, esc);
                long long v;
                int digits = o != NULL && parse_digits(o, &v);
                Py_XDECREF(o);
                END_GIL(ps);
                if (o == NULL) return -1;
                if (digits) { ((int64_t *)col->data)[row] = v; return 0; }
            }
            long long code = cache_code(ps, col, s, n, esc);
            if (code < 0) return -1;
            if (k == 's') ((int32_t *)col->data)[row] = (int32_t)code;
            else ((int64_t *)col->data)[row] = -2 - code;
        }
        return 0;
    }
    if (c == '[' && k == 'p') {
        /* list of ints -> product; anything else in it -> default */
        ps->p++;
        skip_ws(ps);
        unsigned long long prod = 1;
        int all_int = 1, count = 0;
        if (ps->p < ps->end && *ps->p == ']') { ps->p++; return 0; }
        while (ps->p < ps->end) {
            char e = *ps->p;
            if (e == '-' || (e >= '0' && e <= '9')) {
                vtype_t t; long long iv; double dv;
                if (scan_number(ps, &t, &iv, &dv) < 0) return -1;
                if (t == V_INT) prod *= (unsigned long long)iv; else all_int = 0;
            } else {
                if (skip_value(ps, 2) < 0) return -1;
                all_int = 0;
            }
            count++;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') { ps->p++; skip_ws(ps); continue; }
            if (ps->p < ps->end && *ps->p == ']') { ps->p++; break; }
            ps->error = 1;
            return -1;
        }
        if (all_int && count > 0) ((int64_t *)col->data)[row] = (int64_t)prod;
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        vtype_t t; long long iv = 0; double dv = 0;
        if (scan_number(ps, &t, &iv, &dv) < 0) return -1;
        switch (k) {
        case 'f':
            if (t == V_INT) ((double *)col->data)[row] = (double)iv;
            else if (t == V_FLOAT && isfinite(dv)) ((double *)col->data)[row] = dv;
            else if (t == V_BIGINT) { ps->error = 1; return -1; }   /* rare: the reference path decides */
            return 0;
        case 'i':
            if (t == V_INT) ((int64_t *)col->data)[row] = iv;
            else if (t == V_FLOAT && isfinite(dv) && fabs(dv) <= 9.2e18) ((int64_t *)col->data)[row] = (long long)dv;
            return 0;
        case 'k':
            if (t == V_INT) ((int64_t *)col->data)[row] = iv;
            return 0;
        default:
            return 0;    /* 's', 'p': a number is "not a str / not a list" -> default */
        }
    }
    return skip_value(ps, 1);     /* true/false/null/object/array: default */
}

static void set_default(column_t *col, Py_ssize_t row) {
    switch (col->kind) {
    case 'f': ((double *)col->data)[row] = col->dflt_f; break;
    case 's': case 'r': ((int32_t *)col->data)[row] = -1; break;
    default: ((int64_t *)col->data)[row] = col->dflt_i; break;
    }
}

/* Rows [from, to) of every column hold the defaults before any event writes them. */
static void fill_defaults(column_t *cols, Py_ssize_t ncols, Py_ssize_t from, Py_ssize_t to) {
    for (Py_ssize_t c = 0; c < ncols; c++) {
        column_t *col = &cols[c];
        if (col->kind == 'f') {
            for (Py_ssize_t r = from; r < to; r++) ((double *)col->data)[r] = col->dflt_f;
        } else if (col->kind == 's' || col->kind == 'r') {
            for (Py_ssize_t r = from; r < to; r++) ((int32_t *)col->data)[r] = -1;
        } else {
            for (Py_ssize_t r = from; r < to; r++) ((int64_t *)col->data)[r] = col->dflt_i;
        }
    }
}

/* Members of an object at ps->p, dispatching keys through `map` into columns. */
static int scan_members(parser_t *ps, keymap_t *map, column_t *cols, Py_ssize_t row,
                        keymap_t *args_map, int *args_seen) {
    int prev = KEYMAP_CAP;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
    while (ps->p < ps->end) {
        const char *key; Py_ssize_t klen; int esc = 0, slot;
        int guess = map->next[prev];
        if (guess >= 0 && quoted_text_at(ps, map->key[guess], map->len[guess])) {
            /* the predicted key, compared in place: no search for its closing quote */
            key = ps->p + 1;
            klen = map->len[guess];
            slot = guess;
            ps->p += klen + 2;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') { ps->error = 1; return -1; }
            ps->p++;
            skip_ws(ps);
        } else {
            if (scan_key(ps, &key, &klen, &esc) < 0) return -1;
            if (esc) { ps->error = 1; return -1; }      /* escaped key: the reference path decides */
            slot = keymap_learn(map, prev, key, klen);
        }
        if (ps->p >= ps->end) { ps->error = 1; return -1; }
        prev = slot >= 0 ? slot : KEYMAP_CAP;
        if (args_map != NULL && !esc && klen == 4 && memcmp(key, "args", 4) == 0) {
            /* the nested object: last "args" wins, like a decoder filling a field twice */
            if (*args_seen) {
                for (Py_ssize_t j = 0; j < KEYMAP_CAP; j++)
                    for (int q = 0; q < args_map->ncols[j]; q++) set_default(&cols[args_map->cols[j][q]], row);
            }
            *args_seen = 1;
            if (*ps->p == '{') {
                if (scan_members(ps, args_map, cols, row, NULL, NULL) < 0) return -1;
            } else if (skip_value(ps, 1) < 0) {
                return -1;
            } else if (*(ps->p - 1) != 'l') {
                return -2;          /* args present but not an object or null: msgspec rejects it */
            }
        } else if (slot < 0 || map->ncols[slot] == 0) {
            if (skip_value(ps, 1) < 0) return -1;
        } else {
            const char *value_start = ps->p;
            for (int q = 0; q < map->ncols[slot]; q++) {
                ps->p = value_start;
                if (store_value(ps, &cols[map->cols[slot][q]], row) < 0) return -1;
            }
        }
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; skip_ws(ps); continue; }
        if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
        ps->error = 1;
        return -1;
    }
    ps->error = 1;
    return -1;
}

/* Every column's buffer to at least `ncap` rows, keeping its rows. -1 with an exception set. */
static int grow_columns(parser_t *ps, scratch_t *s, column_t *cols, Py_ssize_t ncols, Py_ssize_t ncap) {
    for (Py_ssize_t c = 0; c < ncols; c++) {
        size_t nbytes = (size_t)ncap * cols[c].item;
        if (s->bytes[c] < nbytes) {
            char *grown = realloc(s->data[c], nbytes);
            if (grown == NULL) {
                WITH_GIL(ps);
                PyErr_NoMemory();
                END_GIL(ps);
                return -1;
            }
            s->data[c] = grown;
            s->bytes[c] = nbytes;
        }
        cols[c].data = s->data[c];
    }
    return 0;
}

/* ---- routing: the scanned rows split, in C, into the groups the reader keeps ----------------
 * What kineto._Accumulator._add does with numpy over a chunk's columns (the reference, and what
 * runs for chunks decoded by msgspec), done here in one pass without the GIL: complete events
 * ('X') to the event group, with their kind (from the category) and their side rows (GPU launch
 * args, collective args, operator args: by kind, and only rows that hold a value); flow events;
 * '[memory]' instants; metadata events; and the count of every phase. A chunk that holds a phase
 * or category code the routing tables do not cover yet (met for the first time in this chunk)
 * is left to Python. */
enum { PH_OTHER = 0, PH_X = 1, PH_FLOW = 2, PH_INSTANT = 3, PH_META = 4 };
enum { G_X, G_FLOWS, G_GPU, G_COMM, G_OP, G_MEMORY, G_META, NGROUPS };
/* positions of the core specs (kineto._CORE_NAMES) */
enum { C_PH, C_CAT, C_NAME, C_TS, C_DUR, C_PID, C_TID, C_EXT, C_EXT21, C_CORR, C_DEVICE, C_STREAM, C_ID, NCORE };
#define MAX_PRESENCE 16
#define MAX_GROUP_COLS 64

typedef struct {
    Py_ssize_t first, count;       /* the group's specs: [first, first + count) */
    const char *kind_mask;         /* 256 bytes: does an event of this kind get a row */
    int npresence;                 /* a row is kept when one of these specs (relative) holds a value */
    int presence[MAX_PRESENCE];    /* (>= 0; a float: not NaN); none: always kept */
} side_t;

typedef struct {
    const char *ph_class; Py_ssize_t nph;      /* phase code -> PH_* */
    const char *cat_kind; Py_ssize_t ncat;     /* category code -> kind */
    int absent_kind;                           /* kind of an event without a category */
    long long names_known, memory_code;        /* name codes below names_known are known; "[memory]" */
    long long x_offset;                        /* complete events before this chunk */
    side_t side[3];                            /* G_GPU, G_COMM, G_OP */
    Py_ssize_t memory_first, memory_count, meta_label;
} routing_t;

static int routing_parse(PyObject *obj, routing_t *rt, Py_ssize_t ncols) {
    PyObject *sides;
    if (!PyArg_ParseTuple(obj, "y#y#iLLLOnnn", &rt->ph_class, &rt->nph, &rt->cat_kind, &rt->ncat,
                          &rt->absent_kind, &rt->names_known, &rt->memory_code, &rt->x_offset, &sides,
                          &rt->memory_first, &rt->memory_count, &rt->meta_label))
        return -1;
    if (!PyTuple_Check(sides) || PyTuple_GET_SIZE(sides) != 3) goto bad;
    for (int g = 0; g < 3; g++) {
        side_t *sd = &rt->side[g];
        PyObject *presence;
        Py_ssize_t masklen;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(sides, g), "nny#O!", &sd->first, &sd->count, &sd->kind_mask,
                              &masklen, &PyTuple_Type, &presence))
            return -1;
        if (masklen != 256 || sd->first < NCORE || sd->count < 0 || sd->count + 1 > MAX_GROUP_COLS ||
            sd->first + sd->count > ncols || PyTuple_GET_SIZE(presence) > MAX_PRESENCE)
            goto bad;
        sd->npresence = (int)PyTuple_GET_SIZE(presence);
        for (int q = 0; q < sd->npresence; q++) {
            long v = PyLong_AsLong(PyTuple_GET_ITEM(presence, q));
            if (v < 0 || v >= sd->count) goto bad;
            sd->presence[q] = (int)v;
        }
    }
    if (rt->absent_kind < 0 || rt->absent_kind > 255 || rt->memory_first < NCORE || rt->memory_count < 0 ||
        rt->memory_count + 1 > MAX_GROUP_COLS || rt->memory_first + rt->memory_count > ncols ||
        rt->meta_label < NCORE || rt->meta_label >= ncols)
        goto bad;
    return 0;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "scan_events: bad routing");
    return -1;
}

static inline long long col_int(const column_t *c, Py_ssize_t r) {
    return (c->kind == 's' || c->kind == 'r') ? ((const int32_t *)c->data)[r] : ((const int64_t *)c->data)[r];
}

static inline int col_present(const column_t *c, Py_ssize_t r) {
    if (c->kind == 'f') return !isnan(((const double *)c->data)[r]);
    return col_int(c, r) >= 0;
}

/* Pass 1: each row's groups (bits 1 << G_*) and kind, the row count of each group, the phase
   counts. -1: a code the routing does not know (the chunk is routed in Python). */
static int route_classify(const routing_t *rt, const column_t *cols, Py_ssize_t rows, unsigned char *groups,
                          unsigned char *kinds, Py_ssize_t count[NGROUPS], int64_t *phase) {
    const int32_t *ph = (const int32_t *)cols[C_PH].data, *cat = (const int32_t *)cols[C_CAT].data,
                  *name = (const int32_t *)cols[C_NAME].data;
    for (Py_ssize_t r = 0; r < rows; r++) {
        unsigned char in = 0, kind = 0;
        if (ph[r] >= 0) {
            if (ph[r] >= rt->nph) return -1;
            phase[ph[r]]++;
            switch (rt->ph_class[ph[r]]) {
            case PH_X:
                if (cat[r] >= rt->ncat) return -1;
                kind = cat[r] < 0 ? (unsigned char)rt->absent_kind : (unsigned char)rt->cat_kind[cat[r]];
                in = 1 << G_X;
                for (int g = 0; g < 3; g++) {
                    const side_t *sd = &rt->side[g];
                    if (!sd->kind_mask[kind]) continue;
                    int keep = sd->npresence == 0;
                    for (int q = 0; q < sd->npresence && !keep; q++)
                        keep = col_present(&cols[sd->first + sd->presence[q]], r);
                    if (keep) in |= 1 << (G_GPU + g);
                }
                break;
            case PH_FLOW: in = 1 << G_FLOWS; break;
            case PH_META: in = 1 << G_META; break;
            case PH_INSTANT:
                if (rt->memory_code >= 0 && name[r] == rt->memory_code) in = 1 << G_MEMORY;
                else if (name[r] >= rt->names_known) return -1;    /* a new name: "[memory]"? */
                break;
            default: break;
            }
        }
        groups[r] = in;
        kinds[r] = kind;
        if (in) for (int g = 0; g < NGROUPS; g++) count[g] += (in >> g) & 1;
    }
    return 0;
}

/* A group's columns: their item sizes, and for those copied from a scanned column its spec index.
   The others (SRC_FIXED: every column of the complete events and of the flows, and the leading
   columns of the other groups) route_fill writes itself, in the order listed here. */
typedef struct {
    int ncols;
    int source[MAX_GROUP_COLS];
    size_t item[MAX_GROUP_COLS];
} layout_t;
#define SRC_FIXED (-1)

static void layout_add(layout_t *l, int source, size_t item) {
    l->source[l->ncols] = source;
    l->item[l->ncols++] = item;
}

static void layout_fixed(layout_t *l, const size_t *items, int n) {
    for (int k = 0; k < n; k++) layout_add(l, SRC_FIXED, items[k]);
}

static void layout_specs(layout_t *l, const column_t *cols, Py_ssize_t first, Py_ssize_t count) {
    for (Py_ssize_t c = first; c < first + count; c++) layout_add(l, (int)c, cols[c].item);
}

static void route_layouts(const routing_t *rt, const column_t *cols, layout_t out[NGROUPS]) {
    /* kind, name, ts, dur, pid, tid, device, stream, correlation, external id (kineto._X_COLUMNS) */
    static const size_t X_ITEMS[] = {1, 4, 8, 8, 8, 8, 4, 8, 8, 8};
    /* ph, cat, id, ts, pid, tid (kineto._FLOW_COLUMNS) */
    static const size_t FLOW_ITEMS[] = {4, 4, 8, 8, 8, 8};
    static const size_t ROW_ITEMS[] = {8};                 /* row; ts_ns for the memory samples */
    static const size_t META_ITEMS[] = {4, 8, 8};          /* name, pid, tid; then the label */
    memset(out, 0, sizeof(layout_t) * NGROUPS);
    layout_fixed(&out[G_X], X_ITEMS, 10);
    layout_fixed(&out[G_FLOWS], FLOW_ITEMS, 6);
    for (int g = 0; g < 3; g++) {
        layout_fixed(&out[G_GPU + g], ROW_ITEMS, 1);
        layout_specs(&out[G_GPU + g], cols, rt->side[g].first, rt->side[g].count);
    }
    layout_fixed(&out[G_MEMORY], ROW_ITEMS, 1);
    layout_specs(&out[G_MEMORY], cols, rt->memory_first, rt->memory_count);
    layout_fixed(&out[G_META], META_ITEMS, 3);
    layout_specs(&out[G_META], cols, rt->meta_label, 1);
}

/* Row r of the scanned columns into the spec-copied columns of a group's row i. */
static inline void copy_specs(const layout_t *l, const column_t *cols, Py_ssize_t r, char **dst, Py_ssize_t i) {
    for (int k = 0; k < l->ncols; k++) {
        if (l->source[k] == SRC_FIXED) continue;
        const column_t *c = &cols[l->source[k]];
        if (l->item[k] == 8) ((int64_t *)dst[k])[i] = ((const int64_t *)c->data)[r];
        else ((int32_t *)dst[k])[i] = ((const int32_t *)c->data)[r];
    }
}

/* Pass 2: the rows of each group into its columns (`out[g][k]`: count[g] values each, in the
   order of route_layouts), after the rows they hold already; xi: complete events of this call before
   these rows. */
static void route_fill(const routing_t *rt, const column_t *cols, Py_ssize_t rows, const unsigned char *groups,
                       const unsigned char *kinds, const layout_t layouts[NGROUPS], char **out[NGROUPS],
                       const Py_ssize_t first[NGROUPS], Py_ssize_t xi) {
    Py_ssize_t at[NGROUPS];
    memcpy(at, first, sizeof(at));     /* rows already in each group's columns */
    const int32_t *ph = (const int32_t *)cols[C_PH].data, *cat = (const int32_t *)cols[C_CAT].data,
                  *name = (const int32_t *)cols[C_NAME].data;
    const int64_t *ts = (const int64_t *)cols[C_TS].data, *dur = (const int64_t *)cols[C_DUR].data,
                  *pid = (const int64_t *)cols[C_PID].data, *tid = (const int64_t *)cols[C_TID].data,
                  *ext = (const int64_t *)cols[C_EXT].data, *ext21 = (const int64_t *)cols[C_EXT21].data,
                  *corr = (const int64_t *)cols[C_CORR].data, *device = (const int64_t *)cols[C_DEVICE].data,
                  *stream = (const int64_t *)cols[C_STREAM].data, *id = (const int64_t *)cols[C_ID].data;
    char **x = out[G_X], **f = out[G_FLOWS];
    for (Py_ssize_t r = 0; r < rows; r++) {
        unsigned char in = groups[r];
        if (in == 0) continue;
        if (in & (1 << G_X)) {
            Py_ssize_t i = at[G_X]++;
            ((uint8_t *)x[0])[i] = kinds[r];
            ((int32_t *)x[1])[i] = name[r];
            ((int64_t *)x[2])[i] = ts[r];
            ((int64_t *)x[3])[i] = dur[r];
            ((int64_t *)x[4])[i] = pid[r];
            ((int64_t *)x[5])[i] = tid[r];
            ((int32_t *)x[6])[i] = (int32_t)device[r];
            ((int64_t *)x[7])[i] = stream[r];
            ((int64_t *)x[8])[i] = corr[r];
            ((int64_t *)x[9])[i] = ext[r] >= 0 ? ext[r] : ext21[r];
            for (int g = G_GPU; g <= G_OP; g++) {
                if (!(in & (1 << g))) continue;
                Py_ssize_t j = at[g]++;
                ((int64_t *)out[g][0])[j] = rt->x_offset + xi;
                copy_specs(&layouts[g], cols, r, out[g], j);
            }
            xi++;
        } else if (in & (1 << G_FLOWS)) {
            Py_ssize_t i = at[G_FLOWS]++;
            ((int32_t *)f[0])[i] = ph[r];
            ((int32_t *)f[1])[i] = cat[r];
            ((int64_t *)f[2])[i] = id[r];
            ((int64_t *)f[3])[i] = ts[r];
            ((int64_t *)f[4])[i] = pid[r];
            ((int64_t *)f[5])[i] = tid[r];
        } else if (in & (1 << G_MEMORY)) {
            Py_ssize_t i = at[G_MEMORY]++;
            ((int64_t *)out[G_MEMORY][0])[i] = ts[r];
            copy_specs(&layouts[G_MEMORY], cols, r, out[G_MEMORY], i);
        } else if (in & (1 << G_META)) {
            Py_ssize_t i = at[G_META]++;
            ((int32_t *)out[G_META][0])[i] = name[r];
            ((int64_t *)out[G_META][1])[i] = pid[r];
            ((int64_t *)out[G_META][2])[i] = tid[r];
            copy_specs(&layouts[G_META], cols, r, out[G_META], i);
        }
    }
}

/* Rows are routed a block at a time, so that the scanned columns of a block (48 columns: ~0.7 MB)
   are reused while they are still in the CPU's cache. */
#define ROUTE_BLOCK 2048

struct routed {           /* what the routing of one scan call has made so far */
    layout_t layouts[NGROUPS];
    Py_ssize_t count[NGROUPS];                     /* rows in each group */
    char *data[NGROUPS][MAX_GROUP_COLS];           /* their columns (kept from call to call) */
    size_t bytes[NGROUPS][MAX_GROUP_COLS];         /* capacity of each */
    Py_ssize_t xi;                                 /* complete events */
    int64_t *phase;                                /* events of each phase code */
    Py_ssize_t nph;
    unsigned char groups[2 * ROUTE_BLOCK];         /* per row of a block: its groups, its kind */
};

static void routed_free(routed_t *R) {
    for (int g = 0; g < NGROUPS; g++)
        for (int k = 0; k < MAX_GROUP_COLS; k++) free(R->data[g][k]);
    free(R->phase);
    memset(R, 0, sizeof(*R));
}

/* Empty, for a call with routing `rt` (its buffers kept). -1 when out of memory. */
static int routed_start(routed_t *R, const routing_t *rt, const column_t *cols) {
    route_layouts(rt, cols, R->layouts);
    memset(R->count, 0, sizeof(R->count));
    R->xi = 0;
    free(R->phase);
    R->nph = rt->nph;
    R->phase = calloc((size_t)(rt->nph ? rt->nph : 1), sizeof(int64_t));
    return R->phase ? 0 : -1;
}

/* Route `rows` scanned rows (at most ROUTE_BLOCK). 0 ok; 1 a code the routing does not know (the
   chunk is scanned again without routing); -1 out of memory (exception set). */
static int route_block(parser_t *ps, const routing_t *rt, const column_t *cols, Py_ssize_t rows, routed_t *R) {
    Py_ssize_t count[NGROUPS] = {0};
    char **out[NGROUPS];
    if (route_classify(rt, cols, rows, R->groups, R->groups + ROUTE_BLOCK, count, R->phase) < 0) return 1;
    for (int g = 0; g < NGROUPS; g++) {
        const layout_t *l = &R->layouts[g];
        for (int k = 0; k < l->ncols && count[g]; k++) {
            size_t need = (size_t)(R->count[g] + count[g]) * l->item[k];
            if (R->bytes[g][k] < need) {
                size_t cap = need > 2 * R->bytes[g][k] ? need : 2 * R->bytes[g][k];
                char *grown = realloc(R->data[g][k], cap);
                if (grown == NULL) {
                    WITH_GIL(ps);
                    PyErr_NoMemory();
                    END_GIL(ps);
                    return -1;
                }
                R->data[g][k] = grown;
                R->bytes[g][k] = cap;
            }
        }
        out[g] = R->data[g];
    }
    route_fill(rt, cols, rows, R->groups, R->groups + ROUTE_BLOCK, R->layouts, out, R->count, R->xi);
    for (int g = 0; g < NGROUPS; g++) R->count[g] += count[g];
    R->xi += count[G_X];
    return 0;
}

/* The routed rows as (list of NGROUPS lists of column bytes, phase counts bytes). With the GIL. */
static PyObject *routed_result(const routed_t *R) {
    PyObject *lists = PyList_New(NGROUPS);
    for (int g = 0; lists != NULL && g < NGROUPS; g++) {
        const layout_t *l = &R->layouts[g];
        PyObject *list = PyList_New(l->ncols);
        if (list == NULL) { Py_CLEAR(lists); break; }
        PyList_SET_ITEM(lists, g, list);
        for (int k = 0; k < l->ncols; k++) {
            PyObject *b = PyBytes_FromStringAndSize(R->count[g] ? R->data[g][k] : NULL,
                                                    R->count[g] * (Py_ssize_t)l->item[k]);
            if (b == NULL) { Py_CLEAR(lists); break; }
            PyList_SET_ITEM(list, k, b);
        }
    }
    if (lists == NULL) return NULL;
    return Py_BuildValue("(Ny#)", lists, (const char *)R->phase, R->nph * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *scan_events(PyObject *self, PyObject *args) {
    PyObject *bufobj, *specs, *tables, *state = Py_None, *routing = Py_None;
    if (!PyArg_ParseTuple(args, "OOO!|OO", &bufobj, &specs, &PyList_Type, &tables, &state, &routing)) return NULL;
    Py_ssize_t ntables = PyList_GET_SIZE(tables);
    scanstate_t *st = NULL;
    if (state != Py_None) {
        st = PyCapsule_GetPointer(state, STATE_CAPSULE);
        if (st == NULL) return NULL;
        if (st->n != ntables) {
            PyErr_SetString(PyExc_ValueError, "scan_events: a scan state for another number of tables");
            return NULL;
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *seq = PySequence_Fast(specs, "scan_events: specs must be a sequence");
    if (seq == NULL) { PyBuffer_Release(&view); return NULL; }
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    column_t *cols = calloc((size_t)(ncols ? ncols : 1), sizeof(column_t));
    strcache_t *caches = st ? st->caches : calloc((size_t)(ntables ? ntables : 1), sizeof(strcache_t));
    keymap_t *top = calloc(1, sizeof(keymap_t));
    keymap_t *inner = calloc(1, sizeof(keymap_t));
    PyObject *result = NULL;
    Py_ssize_t cap = 0, filled = 0, row = 0, bad = 0;
    parser_t ps = {(const char *)view.buf, (const char *)view.buf + view.len, 0, NULL};
    scratch_t local = {0};
    scratch_t *scratch = st ? &st->scratch : &local;
    if (!cols || !caches || !top || !inner || scratch_ready(scratch, ncols) < 0) { PyErr_NoMemory(); goto done; }
    keymap_init(top);
    keymap_init(inner);
    for (Py_ssize_t t = 0; t < ntables; t++) caches[t].table = PyList_GET_ITEM(tables, t);

    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *spec = PySequence_Fast_GET_ITEM(seq, c);
        PyObject *outer, *innerk, *deflt;
        const char *kind;
        Py_ssize_t tindex;
        if (!PyArg_ParseTuple(spec, "UOsOn", &outer, &innerk, &kind, &deflt, &tindex)) goto done;
        column_t *col = &cols[c];
        col->kind = kind[0];
        col->item = (col->kind == 's' || col->kind == 'r') ? 4 : 8;
        if (strchr("tfiskrp", col->kind) == NULL) { PyErr_Format(PyExc_ValueError, "unknown kind %c", col->kind); goto done; }
        col->dflt_f = PyFloat_AsDouble(deflt);
        if (PyErr_Occurred()) goto done;
        col->dflt_i = PyLong_Check(deflt) ? PyLong_AsLongLong(deflt) : (long long)col->dflt_f;
        if (PyErr_Occurred()) goto done;
        if (col->kind == 's' || col->kind == 'k' || col->kind == 'r') {
            if (tindex < 0 || tindex >= ntables || !PyDict_Check(PyList_GET_ITEM(tables, tindex))) {
                PyErr_SetString(PyExc_ValueError, "scan_events: bad table index");
                goto done;
            }
            col->cache = &caches[tindex];
        }
        Py_ssize_t klen;
        const char *k = PyUnicode_AsUTF8AndSize(innerk == Py_None ? outer : innerk, &klen);
        if (k == NULL) goto done;
        if (innerk == Py_None) keymap_add(top, k, klen, (int)c);
        else keymap_add(inner, k, klen, (int)c);
        col->inner = innerk != Py_None;
    }

    routing_t rt;
    routed_t *R = NULL;            /* the routing's output, while the rows are routed */
    if (routing != Py_None) {
        if (ncols < NCORE || routing_parse(routing, &rt, ncols) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "scan_events: routing needs the core specs");
            goto done;
        }
        if (st == NULL) {
            PyErr_SetString(PyExc_TypeError, "scan_events: routing needs a scan state");
            goto done;
        }
        if (st->routed == NULL) st->routed = calloc(1, sizeof(routed_t));
        R = st->routed;
        if (R == NULL || routed_start(R, &rt, cols) < 0) { PyErr_NoMemory(); goto done; }
    }
    Py_ssize_t routed_rows = 0;    /* rows of the blocks routed already */

    ps.released = PyEval_SaveThread();
scan:
    skip_ws(&ps);
    if (ps.p >= ps.end || *ps.p != '[') { ps.error = 1; goto done; }
    ps.p++;
    skip_ws(&ps);
    if (ps.p < ps.end && *ps.p == ']') { ps.p++; goto finished; }
    while (ps.p < ps.end) {
        if (R != NULL && row == ROUTE_BLOCK) {
            int rc = route_block(&ps, &rt, cols, row, R);
            if (rc < 0) goto done;
            if (rc > 0) goto unrouted;
            routed_rows += row;
            row = filled = 0;
        }
        if (row >= cap) {
            Py_ssize_t ncap = R != NULL ? ROUTE_BLOCK
                            : cap ? cap + cap / 2 : (view.len / 256 > 1024 ? view.len / 256 : 1024);
            if (grow_columns(&ps, scratch, cols, ncols, ncap) < 0) goto done;
            cap = ncap;
        }
        if (row >= filled) {          /* defaults a block at a time: no writes past the last row */
            Py_ssize_t to = filled + 4096 < cap ? filled + 4096 : cap;
            fill_defaults(cols, ncols, filled, to);
            filled = to;
        }
        if (*ps.p == '{') {
            int args_seen = 0;
            const char *event_start = ps.p;
            int rc = scan_members(&ps, top, cols, row, inner, &args_seen);
            if (rc == -2) {              /* badly typed args: leave this chunk to the msgspec path */
                ps.p = event_start;
                ps.error = 1;
                goto done;
            }
            if (rc < 0) goto done;
            row++;
        } else {
            if (skip_value(&ps, 1) < 0) goto done;
            bad++;
        }
        skip_ws(&ps);
        if (ps.p < ps.end && *ps.p == ',') { ps.p++; skip_ws(&ps); continue; }
        if (ps.p < ps.end && *ps.p == ']') { ps.p++; goto finished; }
        ps.error = 1;
        goto done;
    }
    ps.error = 1;
    goto done;

unrouted:
    /* a phase, category or name code the routing does not cover yet: the chunk again, unrouted */
    R = NULL;
    ps.p = (const char *)view.buf;
    ps.error = 0;
    row = filled = cap = bad = routed_rows = 0;
    goto scan;

finished:
    skip_ws(&ps);
    if (ps.p != ps.end) { ps.error = 1; goto done; }
    if (R != NULL) {
        int rc = route_block(&ps, &rt, cols, row, R);
        if (rc < 0) goto done;
        if (rc > 0) goto unrouted;
        PyEval_RestoreThread(ps.released);
        ps.released = NULL;
        PyObject *routed = routed_result(R);
        if (routed != NULL) result = Py_BuildValue("(Nnn)", routed, routed_rows + row, bad);
        goto done;
    }
    PyEval_RestoreThread(ps.released);
    ps.released = NULL;
    {
        PyObject *list = PyList_New(ncols);
        if (list == NULL) goto done;
        for (Py_ssize_t c = 0; c < ncols; c++) {
            PyObject *b = PyBytes_FromStringAndSize(row ? cols[c].data : NULL, row * (Py_ssize_t)cols[c].item);
            if (b == NULL) {
                Py_DECREF(list);
                goto done;
            }
            PyList_SET_ITEM(list, c, b);
        }
        result = Py_BuildValue("(Nnn)", list, row, bad);
    }

done:
    if (ps.released != NULL) { PyEval_RestoreThread(ps.released); ps.released = NULL; }
    if (result == NULL && PyErr_Occurred() &&
        (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError) || PyErr_ExceptionMatches(PyExc_ValueError)))
        PyErr_Clear();            /* invalid UTF-8 and similar: the msgspec path decides */
    if (result == NULL && !PyErr_Occurred())
        result = PyLong_FromSsize_t(ps.p - (const char *)view.buf);     /* declined: where it stopped */
    scratch_free(&local);
    if (caches && st == NULL) {
        for (Py_ssize_t t = 0; t < ntables; t++) cache_free(&caches[t]);
        free(caches);
    }
    free(cols); free(top); free(inner);
    Py_DECREF(seq);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"columnize", columnize, METH_VARARGS, "Extract typed column buffers from a list of Structs."},
    {"scan_events", scan_events, METH_VARARGS, "Scan a JSON array of trace events into typed column buffers."},
    {"scan_state", scan_state, METH_O, "What scan_events keeps across the calls of one file."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_fastcols", "Column extraction for rankscope ingest.", -1, methods,
};

PyMODINIT_FUNC PyInit__fastcols(void) { return PyModule_Create(&moduledef); }

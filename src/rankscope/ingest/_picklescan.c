/*
 * rankscope.ingest._picklescan: how much hashing unpickling a byte string would do, counted from
 * its opcodes without building anything: the C twin of `safe_pickle._hash_work`, which defines
 * the contract (tests check that both count the same).
 *
 * hash_work(data, limit, table) -> int
 *   data   the pickle (any bytes-like)
 *   limit  stop once the count passes it
 *   table  256 entries, one per opcode byte (None: not an opcode), each a tuple
 *          (arg, special, below, to_mark, pushed):
 *            arg      >= 0 fixed bytes; -1 one line; -6 two lines; -2 1-byte length; -3 4-byte signed
 *                     length; -4 4-byte unsigned length; -5 8-byte unsigned length (pickletools' n)
 *            special  what the opcode does to the count (SP_* below), else 0: the generic stack effect
 *            below / to_mark / pushed   its stack effect, as pickletools declares it
 *
 * Each object on the simulated stack is its hashing cost (a tuple: 1 + its items' costs, shared
 * ones at every use; an int: 1 + its bits // 60; anything else 1), flagged (STR_BIT) when it is a
 * str. A key or member that is not a str may collide with every one before it (their hashes can be
 * chosen: an int's is the int mod 2**61 - 1), so the n-th such one in the file also counts n - 1.
 * A stream that breaks (unknown
 * opcode, cut argument, stack underflow) ends the count there, as it ends `pickletools.genops`.
 * Text arguments of GET / PUT / INT / LONG and the bytes of LONG1 / LONG4 are read with Python's
 * own int(), as genops reads them. Counts saturate at UINT64_MAX.
 *
 * Refused outright (the result is then negative, as `safe_pickle.REFUSED` names them): an EXT1 /
 * EXT2 / EXT4 opcode (-1), a PUT / BINPUT / LONG_BINPUT index above the number of objects memoized
 * so far (-2).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { SP_NONE, SP_GET, SP_BINGET, SP_LONG_BINGET, SP_PUT, SP_BINPUT, SP_LONG_BINPUT, SP_MEMOIZE, SP_MARK,
       SP_TUPLE_N, SP_SETITEM, SP_DUP, SP_POP, SP_PAIRS, SP_ALL, SP_TUPLE, SP_INT_TEXT, SP_LONG_TEXT,
       SP_LONG_BYTES, SP_STOP, SP_EXT, SP_STR };

/* A str on the stack: its cost (1) with this bit set; costs saturate below it. */
#define STR_BIT (1ull << 63)
#define COST(x) ((x) & ~STR_BIT)
static inline uint64_t cost_add(uint64_t a, uint64_t b) { return a + b >= STR_BIT || a + b < a ? STR_BIT - 1 : a + b; }

enum { REFUSED_EXT = -1, REFUSED_MEMO_INDEX = -2 };

typedef struct { int arg, special, below, to_mark, pushed, n; int valid; } op_t;

typedef struct { uint64_t *v; Py_ssize_t len, cap; } vec_t;

static int vec_push(vec_t *s, uint64_t x) {
    if (s->len == s->cap) {
        Py_ssize_t cap = s->cap ? 2 * s->cap : 256;
        uint64_t *v = PyMem_Realloc(s->v, (size_t)cap * sizeof(uint64_t));
        if (!v) { PyErr_NoMemory(); return -1; }
        s->v = v; s->cap = cap;
    }
    s->v[s->len++] = x;
    return 0;
}

static inline uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* The memo: key (an int64, or a hash of an int too large for one, flagged) -> cost. */
typedef struct { int64_t key; uint8_t big, used; uint64_t cost; } slot_t;
typedef struct { slot_t *s; size_t cap, n; } memo_t;

static size_t slot_of(const memo_t *m, int64_t key, uint8_t big) {
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull ^ big;
    size_t i = (size_t)(h ^ (h >> 29)) & (m->cap - 1);
    while (m->s[i].used && !(m->s[i].key == key && m->s[i].big == big)) i = (i + 1) & (m->cap - 1);
    return i;
}

static int memo_put(memo_t *m, int64_t key, uint8_t big, uint64_t cost) {
    if (2 * (m->n + 1) > m->cap) {
        memo_t bigger = {PyMem_Calloc(m->cap ? 2 * m->cap : 1024, sizeof(slot_t)), m->cap ? 2 * m->cap : 1024, 0};
        if (!bigger.s) { PyErr_NoMemory(); return -1; }
        for (size_t i = 0; i < m->cap; i++)
            if (m->s[i].used) { bigger.s[slot_of(&bigger, m->s[i].key, m->s[i].big)] = m->s[i]; bigger.n++; }
        PyMem_Free(m->s);
        *m = bigger;
    }
    size_t i = slot_of(m, key, big);
    if (!m->s[i].used) { m->s[i].used = 1; m->s[i].key = key; m->s[i].big = big; m->n++; }
    m->s[i].cost = cost;
    return 0;
}

static uint64_t memo_get(const memo_t *m, int64_t key, uint8_t big) {
    if (!m->cap) return 1;
    size_t i = slot_of(m, key, big);
    return m->s[i].used ? m->s[i].cost : 1;
}

/* Python's int of a line (genops: int(s)), or NULL (error cleared) when it is none. */
static PyObject *int_of_text(const char *p, Py_ssize_t n, int strip_l) {
    if (strip_l && n > 0 && p[n - 1] == 'L') n--;
    PyObject *text = PyBytes_FromStringAndSize(p, n);
    if (!text) { PyErr_Clear(); return NULL; }
    PyObject *v = PyNumber_Long(text);
    Py_DECREF(text);
    if (!v) PyErr_Clear();
    return v;
}

/* A memo key from an int object: (int64, 0), or (hash, 1) for one beyond int64. */
static int key_of(PyObject *v, int64_t *key, uint8_t *big) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (!overflow) { *key = x; *big = 0; return 0; }
    Py_hash_t h = PyObject_Hash(v);
    if (h == -1 && PyErr_Occurred()) return -1;
    *key = (int64_t)h; *big = 1;
    return 0;
}

static uint64_t int_cost(PyObject *v) {
    PyObject *bits = PyObject_CallMethod(v, "bit_length", NULL);
    if (!bits) { PyErr_Clear(); return 1; }
    unsigned long long b = PyLong_AsUnsignedLongLong(bits);
    Py_DECREF(bits);
    if (PyErr_Occurred()) { PyErr_Clear(); return UINT64_MAX; }
    return 1 + b / 60;
}

static int load_table(PyObject *table, op_t ops[256]) {
    if (!PyList_Check(table) || PyList_GET_SIZE(table) != 256) {
        PyErr_SetString(PyExc_TypeError, "hash_work: table must be a list of 256 entries");
        return -1;
    }
    for (int c = 0; c < 256; c++) {
        PyObject *t = PyList_GET_ITEM(table, c);
        ops[c].valid = t != Py_None;
        if (!ops[c].valid) continue;
        if (!PyArg_ParseTuple(t, "iiiii", &ops[c].arg, &ops[c].special, &ops[c].below, &ops[c].to_mark,
                              &ops[c].pushed))
            return -1;
    }
    return 0;
}

static PyObject *hash_work(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned long long limit;
    PyObject *table;
    if (!PyArg_ParseTuple(args, "y*KO", &buf, &limit, &table)) return NULL;
    op_t ops[256];
    vec_t stack = {0}, marks = {0};
    memo_t memo = {0};
    uint64_t work = 0;
    int failed = 0, refused = 0;
    uint64_t others = 0;                            /* keys and members so far that are not a str */
    if (load_table(table, ops) < 0) { PyBuffer_Release(&buf); return NULL; }
    const unsigned char *d = buf.buf;
    Py_ssize_t len = buf.len, pos = 0;
#define NEED(k) if (pos + (Py_ssize_t)(k) > len) goto end
#define FAIL { failed = 1; goto end; }
#define BASE (marks.len ? (Py_ssize_t)marks.v[marks.len - 1] : 0)
    while (pos < len) {
        const op_t *op = &ops[d[pos]];
        if (!op->valid) goto end;
        Py_ssize_t at = pos + 1, arg_at = at, arg_len = 0;
        pos = at;
        if (op->arg >= 0) { NEED(op->arg); arg_len = op->arg; pos += arg_len; }
        else if (op->arg == -1 || op->arg == -6) {
            for (int lines = op->arg == -1 ? 1 : 2; lines > 0; lines--) {
                const unsigned char *nl = memchr(d + pos, '\n', (size_t)(len - pos));
                if (!nl) goto end;
                pos = (nl - d) + 1;
            }
            arg_len = pos - at - 1;                 /* without the (last) newline */
        } else {
            int w = op->arg == -2 ? 1 : op->arg == -5 ? 8 : 4;
            NEED(w);
            uint64_t n = 0;
            for (int i = w - 1; i >= 0; i--) n = (n << 8) | d[pos + i];
            if (op->arg == -3 && (n & 0x80000000u)) goto end;        /* a negative length */
            pos += w;
            arg_at = pos;
            if (n > (uint64_t)(len - pos)) goto end;
            arg_len = (Py_ssize_t)n;
            pos += arg_len;
        }
        const unsigned char *a = d + arg_at;
        int64_t key = 0;
        uint8_t big = 0;
        switch (op->special) {
        case SP_GET: case SP_PUT: {
            PyObject *v = int_of_text((const char *)a, arg_len, 0);
            if (!v) goto end;
            int r = key_of(v, &key, &big);
            Py_DECREF(v);
            if (r < 0) FAIL;
            break;
        }
        case SP_BINGET: case SP_BINPUT: key = a[0]; break;
        case SP_LONG_BINGET: case SP_LONG_BINPUT:
            key = (int64_t)((uint32_t)a[0] | (uint32_t)a[1] << 8 | (uint32_t)a[2] << 16 | (uint32_t)a[3] << 24);
            break;
        default: break;
        }
        switch (op->special) {
        case SP_GET: case SP_BINGET: case SP_LONG_BINGET:
            if (vec_push(&stack, memo_get(&memo, key, big)) < 0) FAIL;
            break;
        case SP_MEMOIZE:
            if (!stack.len) goto end;
            if (memo_put(&memo, (int64_t)memo.n, 0, stack.v[stack.len - 1]) < 0) FAIL;
            break;
        case SP_PUT: case SP_BINPUT: case SP_LONG_BINPUT:
            if (!stack.len) goto end;
            if (big || key < 0 || (uint64_t)key > memo.n) { refused = REFUSED_MEMO_INDEX; goto end; }
            if (memo_put(&memo, key, big, stack.v[stack.len - 1]) < 0) FAIL;
            break;
        case SP_EXT:
            refused = REFUSED_EXT;
            goto end;
        case SP_MARK:
            if (vec_push(&marks, (uint64_t)stack.len) < 0) FAIL;
            break;
        case SP_TUPLE_N: {
            Py_ssize_t n = op->below;
            if (stack.len - BASE < n) goto end;
            uint64_t cost = 1;
            for (Py_ssize_t i = stack.len - n; i < stack.len; i++) cost = cost_add(cost, COST(stack.v[i]));
            stack.len -= n;
            stack.v[stack.len++] = cost;
            break;
        }
        case SP_SETITEM:
            if (stack.len - BASE < 3) goto end;
            work = sat_add(work, COST(stack.v[stack.len - 2]));
            if (!(stack.v[stack.len - 2] & STR_BIT)) work = sat_add(work, others++);
            stack.len -= 2;
            break;
        case SP_DUP:
            if (!stack.len) goto end;
            if (vec_push(&stack, stack.v[stack.len - 1]) < 0) FAIL;
            break;
        case SP_POP:
            if (marks.len && (Py_ssize_t)marks.v[marks.len - 1] == stack.len) { marks.len--; break; }
            /* fall through: a plain POP */
        default: {
            uint64_t sum_all = 0, sum_pairs = 0, others_all = 0, others_pairs = 0;
            if (op->to_mark) {
                if (!marks.len) goto end;
                Py_ssize_t from = (Py_ssize_t)marks.v[--marks.len];
                if (from > stack.len) from = stack.len;      /* as stack[at:] past the end: nothing */
                for (Py_ssize_t i = from; i < stack.len; i++) {
                    uint64_t v = COST(stack.v[i]), other = !(stack.v[i] & STR_BIT);
                    sum_all = sat_add(sum_all, v);
                    others_all += other;
                    if ((i - from) % 2 == 0) { sum_pairs = sat_add(sum_pairs, v); others_pairs += other; }
                }
                stack.len = from;
            }
            if (op->below) {
                if (stack.len - BASE < op->below) goto end;
                stack.len -= op->below;
            }
            if (op->special == SP_PAIRS || op->special == SP_ALL) {
                uint64_t k = op->special == SP_PAIRS ? others_pairs : others_all;
                work = sat_add(work, op->special == SP_PAIRS ? sum_pairs : sum_all);
                for (uint64_t j = 0; j < k && work <= limit; j++) work = sat_add(work, others++);
            }
            uint64_t cost = op->special == SP_STR ? (STR_BIT | 1) : 1;
            if (op->special == SP_TUPLE) cost = cost_add(cost, sum_all);
            else if (op->special == SP_INT_TEXT || op->special == SP_LONG_TEXT || op->special == SP_LONG_BYTES) {
                PyObject *v;
                if (op->special == SP_LONG_BYTES && arg_len <= 8) {         /* fits an int64: no Python int */
                    uint64_t u = 0;
                    for (Py_ssize_t i = arg_len - 1; i >= 0; i--) u = (u << 8) | a[i];
                    if (arg_len && arg_len < 8 && (a[arg_len - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * arg_len);
                    uint64_t mag = (arg_len && (a[arg_len - 1] & 0x80)) ? (uint64_t)0 - u : u;
                    int bits = 0;
                    while (mag) { bits++; mag >>= 1; }
                    cost = 1 + (uint64_t)bits / 60;
                    goto pushed;
                }
                if (op->special == SP_LONG_BYTES) {
                    PyObject *raw = PyBytes_FromStringAndSize((const char *)a, arg_len);
                    v = raw ? PyObject_CallMethod((PyObject *)&PyLong_Type, "from_bytes", "Os", raw, "little") : NULL;
                    Py_XDECREF(raw);
                    if (v && arg_len && (a[arg_len - 1] & 0x80)) {          /* signed: v - 2 ** (8 * n) */
                        PyObject *shift = PyLong_FromSsize_t(8 * arg_len), *one = PyLong_FromLong(1);
                        PyObject *p = shift && one ? PyNumber_Lshift(one, shift) : NULL;
                        PyObject *s = p ? PyNumber_Subtract(v, p) : NULL;
                        Py_XDECREF(shift); Py_XDECREF(one); Py_XDECREF(p);
                        Py_DECREF(v);
                        v = s;
                    }
                    if (!v) FAIL;
                } else {
                    v = int_of_text((const char *)a, arg_len, op->special == SP_LONG_TEXT);
                    if (!v) goto end;
                }
                cost = cost_add(0, int_cost(v));
                Py_DECREF(v);
            }
        pushed:
            for (int i = 0; i < op->pushed; i++)
                if (vec_push(&stack, cost) < 0) FAIL;
            if (op->special == SP_STOP) goto end;
        }
        }
        if (work > limit) goto end;
    }
end:
    PyBuffer_Release(&buf);
    PyMem_Free(stack.v);
    PyMem_Free(marks.v);
    PyMem_Free(memo.s);
    if (failed) return NULL;
    if (refused) return PyLong_FromLong(refused);
    return PyLong_FromUnsignedLongLong(work);
#undef NEED
#undef FAIL
#undef BASE
}

static PyMethodDef methods[] = {
    {"hash_work", hash_work, METH_VARARGS, "Items unpickling would hash, counted from the opcodes (see module)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_picklescan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__picklescan(void) { return PyModule_Create(&module); }

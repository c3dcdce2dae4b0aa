/*
 * rankscope.ingest._frpickle: a Flight Recorder dump pickle -> the columns the hang verdict reads,
 * without building the dump's objects (ingest/flight_recorder.py `_c_entries`; the contract is
 * `_plain_entries` over the restricted unpickler's result, and tests/test_frpickle.py checks that
 * both give the same columns, or that this reader leaves the file to that one).
 *
 * read(data, walk_limit) -> None | (top, total, numbers, texts, frames)
 *   None      the file is left to the restricted unpickler: an opcode or a shape no dump written
 *             by torch or by Python's pickler has (any opcode that names a global, calls, refers to
 *             the extension registry or a persistent id; text opcodes; sets; a dict key that is not
 *             a string; a memo index out of sequence; a broken stream). That reader then reads it
 *             or refuses it with its own message; nothing is decided here.
 *   top       {"version", "pg_config", "comm_lib_version", "nccl_version": their values, as the
 *             unpickler would build them}
 *   total     items in the dump's entries
 *   numbers   12 bytes objects, one value per usable entry (flight_recorder.RawEntries' order)
 *   texts     7 (codes, table): pg name, pg desc, profiling name, input sizes, input dtypes, output
 *             sizes, output dtypes (compact text); codes: int32 bytes, per entry its text's index
 *             in table (the texts in order of first use)
 *   frames    frames(places) -> [[(name, file, line)]]: the Python frames of the entries at those
 *             places of the dump's entries
 * Raises WalkLimit where the walk over entries, sizes and frames passes walk_limit (counted as
 * `_plain_entries` counts it).
 *
 * Safety: nothing here is a Python object until the walk: the opcodes are read (without the GIL)
 * into an arena of plain nodes (none, bool, int64, big int, float, string as a slice of the input,
 * bytes, list, tuple, dict), so no class, function or attribute is ever looked up, and nothing is
 * hashed. Every read is bounded by the input's length; every node, item and memo slot was made by
 * an opcode of at least one byte, so memory is linear in the input (at most ~40 bytes per byte).
 * Strings are checked as UTF-8 (surrogates allowed, as pickle's "surrogatepass") when read, as the
 * unpickler checks them. Containers are walked iteratively or to a fixed depth; shared references
 * are counted at each use (`walk_limit`).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { N_NONE = 1, N_TRUE, N_FALSE, N_INT, N_BIGINT, N_FLOAT, N_STR, N_OTHER, N_LIST, N_TUPLE, N_DICT };
/* The fixed nodes: None, True, False. */
enum { ID_NONE = 1, ID_TRUE = 2, ID_FALSE = 3, FIRST_FREE = 4 };

typedef struct {
    uint8_t type;
    uint32_t a, b;          /* N_STR: offset, length in the input; containers: first, last segment (0: none) */
    union { int64_t i; double f; } v;
} node_t;

typedef struct { uint32_t start, count, next; } seg_t;   /* `count` items from items[start] */

typedef struct {
    PyObject_HEAD
    Py_buffer buf;
    const uint8_t *d;
    size_t len;
    node_t *nodes; size_t n_nodes, cap_nodes;
    seg_t *segs; size_t n_segs, cap_segs;
    uint32_t *items; size_t n_items, cap_items;
    uint32_t *stack; size_t sp, cap_stack;
    size_t *marks; size_t n_marks, cap_marks;
    uint32_t *memo; size_t cap_memo, memo_count;
    uint32_t root;
    PyObject **strs;        /* per node: its str, made once */
    uint32_t *entries;      /* the nodes of the dump's entries, in order */
    size_t n_entries;
    unsigned long long walked, limit;
    int nomem;
} Reader;

static PyObject *WalkLimit;
static PyTypeObject ReaderType;

/* ------------------------------------------------------------------------------------ the arena */
static int grow(void **p, size_t *cap, size_t need, size_t item) {
    if (need <= *cap) return 0;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void *q = PyMem_RawRealloc(*p, cap2 * item);
    if (!q) return -1;
    *p = q;
    *cap = cap2;
    return 0;
}
#define GROW(r, arr, cap, need) \
    (grow((void **)&(r)->arr, &(r)->cap, (need), sizeof(*(r)->arr)) < 0 ? ((r)->nomem = 1, -1) : 0)

static uint32_t new_node(Reader *r, uint8_t type) {
    if (GROW(r, nodes, cap_nodes, r->n_nodes + 1) < 0) return 0;
    node_t *n = &r->nodes[r->n_nodes];
    memset(n, 0, sizeof *n);
    n->type = type;
    return (uint32_t)r->n_nodes++;
}

static int push(Reader *r, uint32_t id) {
    if (!id || GROW(r, stack, cap_stack, r->sp + 1) < 0) return -1;
    r->stack[r->sp++] = id;
    return 0;
}

/* Items stack[from .. sp) as a new segment of container `c`. */
static int add_items(Reader *r, uint32_t c, size_t from) {
    size_t count = r->sp - from;
    if (!count) return 0;
    if (GROW(r, items, cap_items, r->n_items + count) < 0 || GROW(r, segs, cap_segs, r->n_segs + 1) < 0)
        return -1;
    memcpy(r->items + r->n_items, r->stack + from, count * sizeof(uint32_t));
    uint32_t s = (uint32_t)r->n_segs++;
    r->segs[s] = (seg_t){(uint32_t)r->n_items, (uint32_t)count, 0};
    r->n_items += count;
    node_t *n = &r->nodes[c];
    if (n->b) r->segs[n->b].next = s; else n->a = s;
    n->b = s;
    n->v.i += (int64_t)count;
    return 0;
}

/* Valid UTF-8, surrogates allowed (pickle decodes strings with "surrogatepass"). */
static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c < 0xC2 || c > 0xF4) return 0;
        size_t k = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
        if (i + k >= n) return 0;
        for (size_t j = 1; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        uint8_t c1 = s[i + 1];
        if ((c == 0xE0 && c1 < 0xA0) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) return 0;
        i += k + 1;
    }
    return 1;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* LONG1 / LONG4 bytes (little-endian, signed): an int64 node, or a big int one. */
static uint32_t long_node(Reader *r, const uint8_t *p, size_t n) {
    int neg = n && (p[n - 1] & 0x80);
    if (n > 8) {
        for (size_t i = 8; i < n; i++)
            if (p[i] != (neg ? 0xFF : 0x00)) return new_node(r, N_BIGINT);
        if (((p[7] & 0x80) != 0) != neg) return new_node(r, N_BIGINT);
        n = 8;
    }
    uint64_t u = le(p, (int)n);
    if (n && n < 8 && neg) u |= ~(uint64_t)0 << (8 * n);
    uint32_t id = new_node(r, N_INT);
    if (id) r->nodes[id].v.i = (int64_t)u;
    return id;
}

static uint32_t int_node(Reader *r, int64_t v) {
    uint32_t id = new_node(r, N_INT);
    if (id) r->nodes[id].v.i = v;
    return id;
}

/* Read the opcodes into the arena (no Python object touched: runs without the GIL).
   0: done (r->root set); 1: left to the restricted unpickler; -1: out of memory. */
static int parse(Reader *r) {
    const uint8_t *d = r->d;
    size_t n = r->len, pos = 0;
    for (int t = 0; t < FIRST_FREE; t++)
        new_node(r, (uint8_t)(t == ID_NONE ? N_NONE : t == ID_TRUE ? N_TRUE : N_FALSE));
    /* torch's dumps: ~1 node per 6 bytes, ~1 item per 4 (grown as needed beyond) */
    if (r->nomem || GROW(r, segs, cap_segs, n / 16 + 1) < 0 || GROW(r, nodes, cap_nodes, n / 4 + 1) < 0 ||
        GROW(r, items, cap_items, n / 4 + 1) < 0)
        return -1;
    r->n_segs = 1;                                      /* segment 0: none */
#define NEED(k) do { if ((size_t)(k) > n - pos) return 1; } while (0)
#define FENCE (r->n_marks ? r->marks[r->n_marks - 1] : 0)
#define TRY(x) do { if ((x) < 0) return r->nomem ? -1 : 1; } while (0)
    while (pos < n) {
        uint8_t op = d[pos++];
        switch (op) {
        case 0x80:                                      /* PROTO */
            NEED(1);
            if (d[pos] > 5) return 1;
            pos += 1;
            break;
        case 0x95: {                                    /* FRAME: a hint of the next bytes' length */
            NEED(8);
            uint64_t k = le(d + pos, 8);
            pos += 8;
            NEED(k);
            break;
        }
        case '.':                                       /* STOP */
            if (r->sp <= FENCE) return 1;
            r->root = r->stack[r->sp - 1];
            return 0;
        case '(':                                       /* MARK */
            TRY(GROW(r, marks, cap_marks, r->n_marks + 1));
            r->marks[r->n_marks++] = r->sp;
            break;
        case '0':                                       /* POP: the top item, or the mark at the top */
            if (r->n_marks && r->marks[r->n_marks - 1] == r->sp) r->n_marks--;
            else if (r->sp <= FENCE) return 1;
            else r->sp--;
            break;
        case '1':                                       /* POP_MARK */
            if (!r->n_marks) return 1;
            r->sp = r->marks[--r->n_marks];
            break;
        case '2':                                       /* DUP */
            if (r->sp <= FENCE) return 1;
            TRY(push(r, r->stack[r->sp - 1]));
            break;
        case 'N': TRY(push(r, ID_NONE)); break;
        case 0x88: TRY(push(r, ID_TRUE)); break;
        case 0x89: TRY(push(r, ID_FALSE)); break;
        case 'J':                                       /* BININT */
            NEED(4);
            TRY(push(r, int_node(r, (int32_t)(uint32_t)le(d + pos, 4))));
            pos += 4;
            break;
        case 'K':                                       /* BININT1 */
            NEED(1);
            TRY(push(r, int_node(r, d[pos])));
            pos += 1;
            break;
        case 'M':                                       /* BININT2 */
            NEED(2);
            TRY(push(r, int_node(r, (int64_t)le(d + pos, 2))));
            pos += 2;
            break;
        case 0x8a: case 0x8b: {                         /* LONG1, LONG4 */
            int w = op == 0x8a ? 1 : 4;
            NEED(w);
            uint64_t k = le(d + pos, w);
            if (w == 4 && (k & 0x80000000u)) return 1;
            pos += w;
            NEED(k);
            TRY(push(r, long_node(r, d + pos, (size_t)k)));
            pos += k;
            break;
        }
        case 'G': {                                     /* BINFLOAT: big-endian double */
            NEED(8);
            uint64_t u = 0;
            for (int i = 0; i < 8; i++) u = (u << 8) | d[pos + i];
            uint32_t id = new_node(r, N_FLOAT);
            if (id) memcpy(&r->nodes[id].v.f, &u, 8);
            TRY(push(r, id));
            pos += 8;
            break;
        }
        case 'X': case 0x8c: case 0x8d:                 /* BINUNICODE, SHORT_BINUNICODE, BINUNICODE8 */
        case 'B': case 'C': case 0x8e: case 0x96: {     /* BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8 */
            int w = (op == 0x8c || op == 'C') ? 1 : (op == 'X' || op == 'B') ? 4 : 8;
            NEED(w);
            uint64_t k = le(d + pos, w);
            pos += w;
            NEED(k);
            int text = op == 'X' || op == 0x8c || op == 0x8d;
            if (text && !utf8_ok(d + pos, (size_t)k)) return 1;
            uint32_t id = new_node(r, text ? N_STR : N_OTHER);
            if (id) { r->nodes[id].a = (uint32_t)pos; r->nodes[id].b = (uint32_t)k; }
            TRY(push(r, id));
            pos += k;
            break;
        }
        case ']': TRY(push(r, new_node(r, N_LIST))); break;
        case '}': TRY(push(r, new_node(r, N_DICT))); break;
        case ')': TRY(push(r, new_node(r, N_TUPLE))); break;
        case 'l': case 't': case 'd': {                 /* LIST, TUPLE, DICT: the items above the mark */
            if (!r->n_marks) return 1;
            size_t from = r->marks[--r->n_marks];
            if (op == 'd') {
                if ((r->sp - from) % 2) return 1;
                for (size_t i = from; i < r->sp; i += 2)
                    if (r->nodes[r->stack[i]].type != N_STR) return 1;
            }
            uint32_t id = new_node(r, op == 'l' ? N_LIST : op == 't' ? N_TUPLE : N_DICT);
            if (!id) return -1;
            TRY(add_items(r, id, from));
            r->sp = from;
            TRY(push(r, id));
            break;
        }
        case 0x85: case 0x86: case 0x87: {             /* TUPLE1, TUPLE2, TUPLE3 */
            size_t k = (size_t)(op - 0x84);
            if (r->sp < FENCE + k) return 1;
            uint32_t id = new_node(r, N_TUPLE);
            if (!id) return -1;
            TRY(add_items(r, id, r->sp - k));
            r->sp -= k;
            TRY(push(r, id));
            break;
        }
        case 'a': case 's': {                           /* APPEND, SETITEM */
            size_t k = op == 'a' ? 1 : 2;
            if (r->sp < FENCE + k + 1) return 1;
            uint32_t c = r->stack[r->sp - k - 1];
            if (r->nodes[c].type != (op == 'a' ? N_LIST : N_DICT)) return 1;
            if (op == 's' && r->nodes[r->stack[r->sp - 2]].type != N_STR) return 1;
            TRY(add_items(r, c, r->sp - k));
            r->sp -= k;
            break;
        }
        case 'e': case 'u': {                           /* APPENDS, SETITEMS */
            if (!r->n_marks) return 1;
            size_t from = r->marks[--r->n_marks];
            if (from < FENCE + 1) return 1;
            uint32_t c = r->stack[from - 1];
            if (r->nodes[c].type != (op == 'e' ? N_LIST : N_DICT)) return 1;
            if (op == 'u') {
                if ((r->sp - from) % 2) return 1;
                for (size_t i = from; i < r->sp; i += 2)
                    if (r->nodes[r->stack[i]].type != N_STR) return 1;
            }
            TRY(add_items(r, c, from));
            r->sp = from;
            break;
        }
        case 'q': case 'r': case 0x94: {                /* BINPUT, LONG_BINPUT, MEMOIZE */
            size_t idx;
            if (op == 0x94) idx = r->memo_count;
            else {
                int w = op == 'q' ? 1 : 4;
                NEED(w);
                idx = (size_t)le(d + pos, w);
                pos += w;
            }
            if (r->sp <= FENCE || idx > r->memo_count) return 1;
            if (idx >= r->cap_memo) {
                size_t old = r->cap_memo;
                TRY(GROW(r, memo, cap_memo, idx + 1));
                memset(r->memo + old, 0, (r->cap_memo - old) * sizeof(uint32_t));
            }
            if (!r->memo[idx]) r->memo_count++;
            r->memo[idx] = r->stack[r->sp - 1];
            break;
        }
        case 'h': case 'j': {                           /* BINGET, LONG_BINGET */
            int w = op == 'h' ? 1 : 4;
            NEED(w);
            size_t idx = (size_t)le(d + pos, w);
            pos += w;
            if (idx >= r->cap_memo || !r->memo[idx]) return 1;
            TRY(push(r, r->memo[idx]));
            break;
        }
        default:
            return 1;
        }
    }
    return 1;                                           /* no STOP: cut short */
#undef NEED
#undef FENCE
#undef TRY
}

/* ------------------------------------------------------------------------------------ the walk */
#define FOR_ITEMS(r, node, it)                                                         \
    for (uint32_t _s = (r)->nodes[node].a; _s; _s = (r)->segs[_s].next)               \
        for (uint32_t _k = 0, it; _k < (r)->segs[_s].count &&                          \
             ((it = (r)->items[(r)->segs[_s].start + _k]), 1); _k++)

static int walk(Reader *r, unsigned long long k) {
    r->walked += k;
    if (r->walked > r->limit) {
        PyErr_SetNone(WalkLimit);
        return -1;
    }
    return 0;
}

static int is_key(Reader *r, uint32_t key, const char *name, size_t n) {
    const node_t *k = &r->nodes[key];
    return k->type == N_STR && k->b == n && !memcmp(r->d + k->a, name, n);
}

/* The values of `names` in dict `dict` (the last one where a key repeats); 0 where absent. */
static void lookup(Reader *r, uint32_t dict, const char *const *names, const size_t *lens, int n_names, uint32_t *out) {
    memset(out, 0, n_names * sizeof(uint32_t));
    if (r->nodes[dict].type != N_DICT) return;
    uint32_t key = 0;
    int i = 0;
    FOR_ITEMS(r, dict, it) {
        if (i++ % 2 == 0) { key = it; continue; }
        for (int j = 0; j < n_names; j++)
            if (is_key(r, key, names[j], lens[j])) { out[j] = it; break; }
    }
}

static PyObject *str_of(Reader *r, uint32_t id) {
    if (!r->strs[id]) {
        r->strs[id] = PyUnicode_DecodeUTF8((const char *)r->d + r->nodes[id].a, r->nodes[id].b, "surrogatepass");
        if (!r->strs[id]) return NULL;
    }
    Py_INCREF(r->strs[id]);
    return r->strs[id];
}

/* The plain object of a node, as the unpickler builds it; NULL without an exception: left to the
   restricted unpickler (a big int, bytes, deeper than `depth`, or more nodes than `*budget`). */
static PyObject *to_python(Reader *r, uint32_t id, int depth, long long *budget) {
    if (--*budget < 0 || depth < 0) return NULL;
    node_t *n = &r->nodes[id];
    switch (n->type) {
    case N_NONE: Py_RETURN_NONE;
    case N_TRUE: Py_RETURN_TRUE;
    case N_FALSE: Py_RETURN_FALSE;
    case N_INT: return PyLong_FromLongLong(n->v.i);
    case N_FLOAT: return PyFloat_FromDouble(n->v.f);
    case N_STR: return str_of(r, id);
    case N_LIST: case N_TUPLE: {
        PyObject *list = PyList_New(0);
        if (!list) return NULL;
        FOR_ITEMS(r, id, it) {
            PyObject *x = to_python(r, it, depth - 1, budget);
            if (!x || PyList_Append(list, x) < 0) { Py_XDECREF(x); Py_DECREF(list); return NULL; }
            Py_DECREF(x);
        }
        if (n->type == N_LIST) return list;
        PyObject *t = PyList_AsTuple(list);
        Py_DECREF(list);
        return t;
    }
    case N_DICT: {
        PyObject *dict = PyDict_New(), *key = NULL;
        if (!dict) return NULL;
        int i = 0;
        FOR_ITEMS(r, id, it) {
            PyObject *x = i++ % 2 == 0 ? str_of(r, it) : to_python(r, it, depth - 1, budget);
            if (!x) { Py_XDECREF(key); Py_DECREF(dict); return NULL; }
            if (i % 2) { key = x; continue; }
            int bad = PyDict_SetItem(dict, key, x);
            Py_DECREF(key); Py_DECREF(x);
            key = NULL;
            if (bad < 0) { Py_DECREF(dict); return NULL; }
        }
        return dict;
    }
    default: return NULL;
    }
}

static int int64_of(Reader *r, uint32_t id, int64_t *v) {
    if (!id || r->nodes[id].type != N_INT) return 0;
    *v = r->nodes[id].v.i;
    return 1;
}

/* Sizes or dtypes as compact text, as `_plain_entries` writes them. */
typedef struct { char *p; size_t n, cap; } text_t;

static int put(text_t *t, const char *s, size_t n) {
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n) cap *= 2;
        char *q = PyMem_Realloc(t->p, cap);
        if (!q) { PyErr_NoMemory(); return -1; }
        t->p = q; t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    return 0;
}

static int put_int(text_t *t, int64_t v) {
    char num[24], *end = num + sizeof num, *p = end;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do { *--p = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) *--p = '-';
    return put(t, p, (size_t)(end - p));
}

/* 1: text written; 0: "?"; -1: error (exception set). */
static int sizes_text(Reader *r, uint32_t v, text_t *t) {
    t->n = 0;
    if (!v || r->nodes[v].type != N_LIST) return 0;
    if (walk(r, (unsigned long long)r->nodes[v].v.i) < 0) return -1;
    if (put(t, "[", 1) < 0) return -1;
    int first = 1;
    FOR_ITEMS(r, v, item) {
        node_t *n = &r->nodes[item];
        if (!first && put(t, ", ", 2) < 0) return -1;
        first = 0;
        if (n->type == N_LIST) {
            if (walk(r, (unsigned long long)n->v.i) < 0) return -1;
            if (put(t, "[", 1) < 0) return -1;
            int first2 = 1;
            FOR_ITEMS(r, item, x) {
                if (r->nodes[x].type != N_INT) return 0;
                if ((!first2 && put(t, ", ", 2) < 0) || put_int(t, r->nodes[x].v.i) < 0) return -1;
                first2 = 0;
            }
            if (put(t, "]", 1) < 0) return -1;
        } else if (n->type == N_STR) {
            if (put(t, (const char *)r->d + n->a, n->b) < 0) return -1;
        } else if (n->type == N_INT) {
            if (put_int(t, n->v.i) < 0) return -1;
        } else return 0;
    }
    return put(t, "]", 1) < 0 ? -1 : 1;
}

/* The last few distinct texts of a column, to give a repeated one the same str. */
#define RECENT 4
typedef struct { PyObject *s[RECENT]; int next; } recent_t;

static PyObject *text_str(recent_t *rc, const text_t *t, int ok) {
    const char *p = ok ? t->p : "?";
    Py_ssize_t n = ok ? (Py_ssize_t)t->n : 1;
    for (int i = 0; i < RECENT; i++) {
        PyObject *s = rc->s[i];
        if (s && PyUnicode_GET_LENGTH(s) <= n) {
            Py_ssize_t size;
            const char *u = PyUnicode_AsUTF8AndSize(s, &size);
            if (u && size == n && !memcmp(u, p, (size_t)n)) { Py_INCREF(s); return s; }
            if (!u) PyErr_Clear();
        }
    }
    PyObject *s = PyUnicode_DecodeUTF8(p, n, "surrogatepass");
    if (!s) return NULL;
    Py_XSETREF(rc->s[rc->next], Py_NewRef(s));
    rc->next = (rc->next + 1) % RECENT;
    return s;
}

enum { F_NAME, F_PG, F_CREATED, F_COLL, F_RECORD, F_P2P_SEQ, F_IS_P2P, F_STATE, F_DURATION, F_STARTED, F_COMPLETED,
       F_TIMEOUT, F_IN_SIZES, F_IN_DTYPES, F_OUT_SIZES, F_OUT_DTYPES, N_FIELDS };
static const char *const FIELDS[N_FIELDS] = {
    "profiling_name", "process_group", "time_created_ns", "collective_seq_id", "record_id", "p2p_seq_id", "is_p2p",
    "state", "duration_ms", "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms",
    "input_sizes", "input_dtypes", "output_sizes", "output_dtypes"};
static size_t FIELD_LENS[N_FIELDS];
static const char *const TOP[] = {"version", "pg_config", "comm_lib_version", "nccl_version", "entries"};
static size_t TOP_LENS[5];
static const char *const FRAME_KEYS[] = {"name", "filename", "line"};
static size_t FRAME_LENS[3];

/* Numbers: where, record_id, coll_seq, p2p_seq, has_p2p_seq, is_p2p, state, created, started,
   completed, duration, timeout (RawEntries' order). */
enum { C_WHERE, C_RECORD, C_COLL, C_P2P, C_HAS_P2P, C_IS_P2P, C_STATE, C_CREATED, C_STARTED, C_COMPLETED, C_DURATION,
       C_TIMEOUT, N_NUMS };
static const size_t NUM_SIZE[N_NUMS] = {8, 8, 8, 8, 1, 1, 1, 8, 8, 8, 8, 8};
enum { T_PG_NAME, T_PG_DESC, T_PROF, T_S0, T_S1, T_S2, T_S3, N_TEXTS };

/* A text column: per entry the code of its text in `table` (texts in order of first use). */
typedef struct { PyObject *seen, *table; int32_t *codes; } texts_t;

/* Adds `s` (a new reference, or NULL: error) as row `n` of column `c`. */
static int add_text(texts_t *c, size_t n, PyObject *s) {
    if (!s) return -1;
    PyObject *code = PyDict_GetItemWithError(c->seen, s);
    if (!code) {
        if (PyErr_Occurred() || !(code = PyLong_FromSsize_t(PyList_GET_SIZE(c->table)))) { Py_DECREF(s); return -1; }
        int bad = PyDict_SetItem(c->seen, s, code) < 0 || PyList_Append(c->table, s) < 0;
        Py_DECREF(code);
        if (bad) { Py_DECREF(s); return -1; }
    }
    Py_DECREF(s);
    c->codes[n] = (int32_t)PyLong_AsLong(code);
    return 0;
}

static PyObject *columns(Reader *r, uint32_t entries_node) {
    size_t total = (size_t)r->nodes[entries_node].v.i;
    char *num[N_NUMS] = {0};
    texts_t col[N_TEXTS] = {{0}};
    PyObject *nums = PyTuple_New(N_NUMS), *texts = PyTuple_New(N_TEXTS), *result = NULL;
    text_t t = {0};
    recent_t recent[4] = {{{0}}};
    if (!nums || !texts) goto done;
    for (int c = 0; c < N_NUMS; c++) {
        num[c] = PyMem_Malloc(total * NUM_SIZE[c] + 1);
        if (!num[c]) { PyErr_NoMemory(); goto done; }
    }
    for (int c = 0; c < N_TEXTS; c++) {
        col[c].seen = PyDict_New();
        col[c].table = PyList_New(0);
        col[c].codes = PyMem_Malloc(total * sizeof(int32_t) + 1);
        if (!col[c].seen || !col[c].table || !col[c].codes) { PyErr_NoMemory(); goto done; }
    }
    r->entries = PyMem_RawMalloc(total * sizeof(uint32_t) + 1);
    if (!r->entries) { PyErr_NoMemory(); goto done; }
    size_t place = 0, n = 0;
    uint32_t f[N_FIELDS];
    FOR_ITEMS(r, entries_node, e) {
        r->entries[place] = e;
        size_t where = place++;
        if (walk(r, 1) < 0) goto done;
        if (r->nodes[e].type != N_DICT) continue;
        lookup(r, e, FIELDS, FIELD_LENS, N_FIELDS, f);
        int64_t created, coll;
        uint32_t pg = f[F_PG];
        uint8_t pgt = pg ? r->nodes[pg].type : 0;
        if (!f[F_NAME] || r->nodes[f[F_NAME]].type != N_STR || !(pgt == N_LIST || pgt == N_TUPLE) ||
            !r->nodes[pg].v.i || !int64_of(r, f[F_CREATED], &created) || !int64_of(r, f[F_COLL], &coll))
            continue;
        const seg_t *s0 = &r->segs[r->nodes[pg].a];
        uint32_t pg0 = r->items[s0->start];
        uint32_t pg1 = r->nodes[pg].v.i < 2 ? 0 : s0->count > 1 ? r->items[s0->start + 1]
                                                               : r->items[r->segs[s0->next].start];
        int64_t v;
        double x;
        ((int64_t *)num[C_WHERE])[n] = (int64_t)where;
        ((int64_t *)num[C_RECORD])[n] = int64_of(r, f[F_RECORD], &v) ? v : 0;
        ((int64_t *)num[C_COLL])[n] = coll;
        int has = int64_of(r, f[F_P2P_SEQ], &v);
        ((int64_t *)num[C_P2P])[n] = has ? v : 0;
        num[C_HAS_P2P][n] = (char)has;
        num[C_IS_P2P][n] = f[F_IS_P2P] == ID_TRUE;
        int8_t state = 0;
        if (f[F_STATE] && r->nodes[f[F_STATE]].type == N_STR) {
            if (is_key(r, f[F_STATE], "started", 7)) state = 1;
            else if (is_key(r, f[F_STATE], "completed", 9)) state = 2;
        }
        num[C_STATE][n] = (char)state;
        ((int64_t *)num[C_CREATED])[n] = created;
        ((int64_t *)num[C_STARTED])[n] = int64_of(r, f[F_STARTED], &v) ? v : 0;
        ((int64_t *)num[C_COMPLETED])[n] = int64_of(r, f[F_COMPLETED], &v) ? v : 0;
        uint32_t dur = f[F_DURATION];
        x = NAN;
        if (dur && r->nodes[dur].type == N_FLOAT) x = r->nodes[dur].v.f;
        else if (int64_of(r, dur, &v)) x = (double)v;
        ((double *)num[C_DURATION])[n] = isfinite(x) ? x : NAN;
        ((double *)num[C_TIMEOUT])[n] = int64_of(r, f[F_TIMEOUT], &v) ? (double)v : NAN;
        uint8_t t0 = r->nodes[pg0].type;
        if (add_text(&col[T_PG_NAME], n, t0 == N_STR ? str_of(r, pg0)
                     : t0 == N_INT ? PyUnicode_FromFormat("%lld", (long long)r->nodes[pg0].v.i)
                     : PyUnicode_FromString("?")) < 0 ||
            add_text(&col[T_PG_DESC], n, pg1 && r->nodes[pg1].type == N_STR ? str_of(r, pg1)
                     : PyUnicode_FromString("")) < 0 ||
            add_text(&col[T_PROF], n, str_of(r, f[F_NAME])) < 0)
            goto done;
        for (int c = 0; c < 4; c++) {
            int ok = sizes_text(r, f[F_IN_SIZES + c], &t);
            if (ok < 0 || add_text(&col[T_S0 + c], n, text_str(&recent[c], &t, ok)) < 0) goto done;
        }
        n++;
    }
    r->n_entries = place;
    for (int c = 0; c < N_NUMS; c++) {
        PyObject *b = PyBytes_FromStringAndSize(num[c], (Py_ssize_t)(n * NUM_SIZE[c]));
        if (!b) goto done;
        PyTuple_SET_ITEM(nums, c, b);
    }
    for (int c = 0; c < N_TEXTS; c++) {
        PyObject *pair = Py_BuildValue("(y#O)", (const char *)col[c].codes, (Py_ssize_t)(n * sizeof(int32_t)),
                                       col[c].table);
        if (!pair) goto done;
        PyTuple_SET_ITEM(texts, c, pair);
    }
    result = Py_BuildValue("(OO)", nums, texts);
done:
    for (int c = 0; c < N_NUMS; c++) PyMem_Free(num[c]);
    for (int c = 0; c < N_TEXTS; c++) {
        Py_XDECREF(col[c].seen);
        Py_XDECREF(col[c].table);
        PyMem_Free(col[c].codes);
    }
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < RECENT; i++) Py_XDECREF(recent[c].s[i]);
    PyMem_Free(t.p);
    Py_XDECREF(nums);
    Py_XDECREF(texts);
    return result;
}

/* frames(places) -> the Python frames of the entries at those places, as `_plain_entries` gives them. */
static PyObject *Reader_frames(Reader *r, PyObject *places) {
    static const char *const FR[] = {"frames"};
    static const size_t FR_LEN[] = {6};
    PyObject *seq = PySequence_Fast(places, "frames: a list of places");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(k);
    if (!out) goto fail;
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t place = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (place < 0 || (size_t)place >= r->n_entries) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "frames: no such entry");
            goto fail;
        }
        uint32_t v;
        lookup(r, r->entries[place], FR, FR_LEN, 1, &v);
        PyObject *frames = PyList_New(0);
        if (!frames) goto fail;
        PyList_SET_ITEM(out, i, frames);
        if (!v || r->nodes[v].type != N_LIST) continue;
        if (walk(r, (unsigned long long)r->nodes[v].v.i) < 0) goto fail;
        FOR_ITEMS(r, v, fr) {
            if (r->nodes[fr].type != N_DICT) continue;
            uint32_t got[3];
            lookup(r, fr, FRAME_KEYS, FRAME_LENS, 3, got);
            PyObject *name = got[0] && r->nodes[got[0]].type == N_STR ? str_of(r, got[0]) : PyUnicode_FromString("?");
            PyObject *file = got[1] && r->nodes[got[1]].type == N_STR ? str_of(r, got[1]) : PyUnicode_FromString("?");
            int64_t line = 0;
            int64_of(r, got[2], &line);
            PyObject *t = name && file ? Py_BuildValue("(OOL)", name, file, (long long)line) : NULL;
            Py_XDECREF(name);
            Py_XDECREF(file);
            int bad = !t || PyList_Append(frames, t) < 0;
            Py_XDECREF(t);
            if (bad) goto fail;
        }
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_XDECREF(out);
    return NULL;
}

static void Reader_dealloc(Reader *r) {
    if (r->strs) {
        for (size_t i = 0; i < r->n_nodes; i++) Py_XDECREF(r->strs[i]);
        PyMem_RawFree(r->strs);
    }
    PyMem_RawFree(r->nodes);
    PyMem_RawFree(r->segs);
    PyMem_RawFree(r->items);
    PyMem_RawFree(r->stack);
    PyMem_RawFree(r->marks);
    PyMem_RawFree(r->memo);
    PyMem_RawFree(r->entries);
    if (r->buf.obj) PyBuffer_Release(&r->buf);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef Reader_methods[] = {
    {"frames", (PyCFunction)Reader_frames, METH_O, "frames(places) -> [[(name, file, line)]] (see the module)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rankscope.ingest._frpickle.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = Reader_methods,
};

static PyObject *fr_read(PyObject *self, PyObject *args) {
    PyObject *data;
    unsigned long long limit;
    if (!PyArg_ParseTuple(args, "SK", &data, &limit)) return NULL;
    Reader *r = PyObject_New(Reader, &ReaderType);
    if (!r) return NULL;
    memset((char *)r + sizeof(PyObject), 0, sizeof(Reader) - sizeof(PyObject));
    if (PyObject_GetBuffer(data, &r->buf, PyBUF_SIMPLE) < 0) { Py_DECREF(r); return NULL; }
    r->d = r->buf.buf;
    r->len = (size_t)r->buf.len;
    r->limit = limit;
    if (r->len >= UINT32_MAX) { Py_DECREF(r); Py_RETURN_NONE; }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = parse(r);
    Py_END_ALLOW_THREADS
    if (status < 0) { Py_DECREF(r); return PyErr_NoMemory(); }
    uint32_t top[5];
    if (status || r->nodes[r->root].type != N_DICT) { Py_DECREF(r); Py_RETURN_NONE; }
    lookup(r, r->root, TOP, TOP_LENS, 5, top);
    if (!top[4] || r->nodes[top[4]].type != N_LIST) { Py_DECREF(r); Py_RETURN_NONE; }
    r->strs = PyMem_RawCalloc(r->n_nodes, sizeof(PyObject *));
    if (!r->strs) { Py_DECREF(r); return PyErr_NoMemory(); }
    PyObject *tops = PyDict_New();
    long long budget = 1 << 22;
    for (int i = 0; tops && i < 4; i++) {
        if (!top[i]) continue;
        PyObject *v = to_python(r, top[i], 8, &budget);
        if (!v) {
            Py_DECREF(tops); Py_DECREF(r);
            if (PyErr_Occurred()) return NULL;
            Py_RETURN_NONE;
        }
        int bad = PyDict_SetItemString(tops, TOP[i], v);
        Py_DECREF(v);
        if (bad < 0) Py_CLEAR(tops);
    }
    if (!tops) { Py_DECREF(r); return NULL; }
    PyObject *config = PyDict_GetItemString(tops, "pg_config");
    PyObject *cols = NULL, *frames = NULL, *result = NULL;
    if (config && PyDict_Check(config) && walk(r, (unsigned long long)PyDict_Size(config)) < 0) goto done;
    cols = columns(r, top[4]);
    if (!cols) goto done;
    frames = PyObject_GetAttrString((PyObject *)r, "frames");
    if (!frames) goto done;
    result = Py_BuildValue("(OnOOO)", tops, (Py_ssize_t)r->nodes[top[4]].v.i, PyTuple_GET_ITEM(cols, 0),
                           PyTuple_GET_ITEM(cols, 1), frames);
done:
    Py_XDECREF(frames);
    Py_XDECREF(cols);
    Py_DECREF(tops);
    Py_DECREF(r);
    return result;
}

static PyMethodDef methods[] = {
    {"read", fr_read, METH_VARARGS, "read(data, walk_limit) -> None | (top, total, numbers, texts, frames)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frpickle", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frpickle(void) {
    for (int i = 0; i < N_FIELDS; i++) FIELD_LENS[i] = strlen(FIELDS[i]);
    for (int i = 0; i < 5; i++) TOP_LENS[i] = strlen(TOP[i]);
    for (int i = 0; i < 3; i++) FRAME_LENS[i] = strlen(FRAME_KEYS[i]);
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    WalkLimit = PyErr_NewException("rankscope.ingest._frpickle.WalkLimit", NULL, NULL);
    if (!WalkLimit || PyModule_AddObject(m, "WalkLimit", WalkLimit) < 0) { Py_DECREF(m); return NULL; }
    Py_INCREF(WalkLimit);
    return m;
}

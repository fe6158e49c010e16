/* hicache.radix.cpack: the token-array helpers of the radix tree that pay to write in C.
 *
 * pack_ids(seq, out) -> int
 *     seq: a list or tuple; out: a writable C-contiguous buffer of at least 4 * len(seq) bytes
 *     (an int32 numpy array). Writes seq[i] to out[i] while seq[i] is an exact int in
 *     [0, 2**31 - 1] and returns how many items it wrote: len(seq) when every item is a valid
 *     token id. The first item it stops at (a bool, a negative or too large int, an integer
 *     scalar such as numpy.int64, a float, anything else) is left to the caller's Python path,
 *     which accepts integer scalars and raises the right error for the rest
 *     (hicache/radix/tokens.py). One pass, the GIL held throughout, no allocation.
 *
 * match_len(key, ids, pos, stop, page) -> int
 *     key, ids: C-contiguous int32 buffers (a node's key, a RadixKey's ids); 0 <= pos <= stop <=
 *     len(ids). How many leading tokens of key equal ids[pos:stop], rounded down to whole pages
 *     of page tokens: one memcmp when they all match (the common case), else 4 KiB memcmp blocks
 *     then a scan of the differing block. No copy, no allocation (hicache/radix/key.py).
 *
 * page_bytes(ids, pos, page) -> bytes
 *     The bytes of ids[pos:pos + page] (a child's key in its parent's dict) in one copy.
 *
 * Exact ints are read from their digits: CPython's small-int layout (public from 3.12 as
 * PyUnstable_Long_CompactValue, the struct's ob_digit before). An int needing more digits than
 * that goes through PyLong_AsLongAndOverflow.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int exact_int_value(PyObject *o, long long *value) {
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        *value = (long long)PyUnstable_Long_CompactValue((PyLongObject *)o);
        return 1;
    }
#else
    Py_ssize_t size = Py_SIZE(o);
    const digit *d = ((PyLongObject *)o)->ob_digit;
    if (size == 0 || size == 1) {
        *value = size ? (long long)d[0] : 0;
        return 1;
    }
#endif
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *value = v;
    return 1;
}

static PyObject *pack_ids(PyObject *self, PyObject *args) {
    PyObject *seq, *out_obj;
    if (!PyArg_ParseTuple(args, "OO:pack_ids", &seq, &out_obj)) {
        return NULL;
    }
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) {
        PyErr_Format(PyExc_TypeError, "seq must be a list or tuple, got %.80s",
                     Py_TYPE(seq)->tp_name);
        return NULL;
    }
    Py_buffer out;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (out.len < n * (Py_ssize_t)sizeof(int32_t)) {
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes, %zd needed", out.len,
                     n * (Py_ssize_t)sizeof(int32_t));
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int32_t *dst = (int32_t *)out.buf;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        long long v;
        PyObject *o = items[i];
        if (!PyLong_CheckExact(o) || !exact_int_value(o, &v) || v < 0 || v > INT32_MAX) {
            break;
        }
        dst[i] = (int32_t)v;
    }
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(i);
}

/* A C-contiguous buffer of 4-byte items; -1 with TypeError/BufferError set otherwise. */
static int get_ids(PyObject *obj, Py_buffer *view, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->itemsize != (Py_ssize_t)sizeof(int32_t)) {
        PyErr_Format(PyExc_TypeError, "%s must hold 4-byte token ids, got %zd-byte items", name,
                     view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

#define BLOCK_ITEMS 1024 /* 4 KiB: a memcmp per block to find the first differing one */

static Py_ssize_t equal_run(const int32_t *a, const int32_t *b, Py_ssize_t n) {
    if (memcmp(a, b, (size_t)n * sizeof(int32_t)) == 0) {
        return n;
    }
    Py_ssize_t i = 0;
    while (i + BLOCK_ITEMS <= n && memcmp(a + i, b + i, BLOCK_ITEMS * sizeof(int32_t)) == 0) {
        i += BLOCK_ITEMS;
    }
    while (a[i] == b[i]) { /* a difference lies in [i, n): the memcmp above found one */
        i++;
    }
    return i;
}

/* args[first:first + n] as Py_ssize_t; -1 with an exception set when one is not an int. */
static int ssize_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *name,
                      Py_ssize_t first, Py_ssize_t *out) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    for (Py_ssize_t i = first; i < nargs; i++) {
        out[i - first] = PyLong_AsSsize_t(args[i]);
        if (out[i - first] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

static PyObject *match_len(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t v[3];
    if (ssize_args(args, nargs, 5, "match_len", 2, v) < 0) {
        return NULL;
    }
    PyObject *key_obj = args[0], *ids_obj = args[1];
    Py_ssize_t pos = v[0], stop = v[1], page = v[2];
    Py_buffer key, ids;
    if (get_ids(key_obj, &key, "key") < 0) {
        return NULL;
    }
    if (get_ids(ids_obj, &ids, "ids") < 0) {
        PyBuffer_Release(&key);
        return NULL;
    }
    Py_ssize_t n_ids = ids.len / (Py_ssize_t)sizeof(int32_t);
    Py_ssize_t matched = -1;
    if (0 <= pos && pos <= stop && stop <= n_ids && page > 0) {
        Py_ssize_t n = key.len / (Py_ssize_t)sizeof(int32_t);
        n = n < stop - pos ? n : stop - pos;
        matched = equal_run((const int32_t *)key.buf, (const int32_t *)ids.buf + pos, n);
        matched -= matched % page;
    } else {
        PyErr_Format(PyExc_ValueError, "match_len: need 0 <= pos (%zd) <= stop (%zd) <= len(ids) "
                     "(%zd) and page (%zd) > 0", pos, stop, n_ids, page);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&ids);
    return matched < 0 ? NULL : PyLong_FromSsize_t(matched);
}

static PyObject *page_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t v[2];
    if (ssize_args(args, nargs, 3, "page_bytes", 1, v) < 0) {
        return NULL;
    }
    PyObject *ids_obj = args[0];
    Py_ssize_t pos = v[0], page = v[1];
    Py_buffer ids;
    if (get_ids(ids_obj, &ids, "ids") < 0) {
        return NULL;
    }
    PyObject *out = NULL;
    if (0 <= pos && 0 < page && pos + page <= ids.len / (Py_ssize_t)sizeof(int32_t)) {
        out = PyBytes_FromStringAndSize((const char *)ids.buf + pos * (Py_ssize_t)sizeof(int32_t),
                                        page * (Py_ssize_t)sizeof(int32_t));
    } else {
        PyErr_Format(PyExc_ValueError, "page_bytes: ids[%zd:%zd + %zd] is not a whole page of "
                     "ids", pos, pos, page);
    }
    PyBuffer_Release(&ids);
    return out;
}

static PyMethodDef cpack_methods[] = {
    {"pack_ids", pack_ids, METH_VARARGS,
     "pack_ids(seq, out) -> int: leading valid token ids of seq written into out"},
    {"match_len", (PyCFunction)(void (*)(void))match_len, METH_FASTCALL,
     "match_len(key, ids, pos, stop, page) -> int: leading tokens of key equal to "
     "ids[pos:stop], whole pages"},
    {"page_bytes", (PyCFunction)(void (*)(void))page_bytes, METH_FASTCALL,
     "page_bytes(ids, pos, page) -> bytes: the bytes of ids[pos:pos + page]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cpack_module = {
    PyModuleDef_HEAD_INIT, "hicache.radix.cpack",
    "Token-array helpers of the radix tree (hicache/radix/tokens.py, key.py).", -1,
    cpack_methods,
};

PyMODINIT_FUNC PyInit_cpack(void) { return PyModule_Create(&cpack_module); }

/* hicache.radix.cpack: token ids from a Python list into an int32 buffer, validated on the way.
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
 * Exact ints are read from their digits: CPython's small-int layout (public from 3.12 as
 * PyUnstable_Long_CompactValue, the struct's ob_digit before). An int needing more digits than
 * that goes through PyLong_AsLongAndOverflow.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

static PyMethodDef cpack_methods[] = {
    {"pack_ids", pack_ids, METH_VARARGS,
     "pack_ids(seq, out) -> int: leading valid token ids of seq written into out"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cpack_module = {
    PyModuleDef_HEAD_INIT, "hicache.radix.cpack",
    "Token ids from a Python list into an int32 buffer (see hicache/radix/tokens.py).", -1,
    cpack_methods,
};

PyMODINIT_FUNC PyInit_cpack(void) { return PyModule_Create(&cpack_module); }

/* hicache.backends.cfile: the file store's page reads, in C with the GIL released
 * (hicache/backends/file_read.py holds the contract and the pure-Python twin).
 *
 * read_pages(paths, buffers, stored, parts, stale_ns) -> list[tuple[int, int, int]]
 *     paths: a list of str (2 * len(paths) == len(buffers)), grouped by page: objects
 *     [i * parts, (i + 1) * parts) are page i's. buffers: writable C-contiguous buffers, two
 *     per object (its payload, then its trailer), whose lengths add up to stored. For each page:
 *     open each object (O_RDONLY | O_CLOEXEC), fstat it (its size must be stored), futimens it
 *     when its mtime is older than stale_ns (the LRU clock); then, only when every object of
 *     the page passed, readv each into its two buffers; close every file. A page stops at its
 *     first failing object. Returns one (step, value, touch) per object:
 *         step 0 NOT_TRIED (an earlier object of its page failed), value 0
 *         step 1 OPEN_FAILED (open or fstat), value errno
 *         step 2 WRONG_SIZE, value its size
 *         step 3 OPENED (passed, not read: a later object of its page failed), value 0
 *         step 4 READ_FAILED, value errno
 *         step 5 SHORT_READ, value the bytes read (< stored)
 *         step 6 READ_OK, value stored
 *         touch: 0 fresh (not touched), 1 touched, -errno when futimens failed.
 *     The system calls run without the GIL: several threads each reading a chunk of a batch keep
 *     several reads in flight. EINTR is retried, as Python's os functions do (PEP 475).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

enum { NOT_TRIED, OPEN_FAILED, WRONG_SIZE, OPENED, READ_FAILED, SHORT_READ, READ_OK };

typedef struct {
    long long step, value, touch;
} result_t;

typedef struct {
    Py_ssize_t n, parts, stored;
    long long stale_ns;
    PyObject **paths;  /* bytes, owned */
    Py_buffer *views;  /* 2 * n, held */
    result_t *results; /* n */
    int *fds;          /* parts */
} job_t;

static int open_retry(const char *path) {
    int fd;
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

/* Open one object onto *fd, check its size, touch it if stale; 1 when it passed. */
static int open_sized(const job_t *job, Py_ssize_t k, int *fd) {
    result_t *r = &job->results[k];
    struct stat st;
    *fd = open_retry(PyBytes_AS_STRING(job->paths[k]));
    if (*fd < 0 || fstat(*fd, &st) != 0) {
        r->step = OPEN_FAILED;
        r->value = errno;
        return 0;
    }
    if ((long long)st.st_size != (long long)job->stored) {
        r->step = WRONG_SIZE;
        r->value = (long long)st.st_size;
        return 0;
    }
    r->step = OPENED;
    long long mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    if (mtime_ns < job->stale_ns) { /* a hit refreshes the LRU */
        r->touch = futimens(*fd, NULL) == 0 ? 1 : -errno;
    }
    return 1;
}

/* readv one opened object into its two buffers; 1 when it read all stored bytes. */
static int read_object(const job_t *job, Py_ssize_t k, int fd) {
    result_t *r = &job->results[k];
    struct iovec iov[2];
    for (int b = 0; b < 2; b++) {
        iov[b].iov_base = job->views[2 * k + b].buf;
        iov[b].iov_len = (size_t)job->views[2 * k + b].len;
    }
    ssize_t got;
    do {
        got = readv(fd, iov, 2);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        r->step = READ_FAILED;
        r->value = errno;
        return 0;
    }
    r->step = got == job->stored ? READ_OK : SHORT_READ;
    r->value = (long long)got;
    return got == job->stored;
}

/* One page: objects [first, first + parts). Every file it opened is closed. */
static void read_page(const job_t *job, Py_ssize_t first) {
    Py_ssize_t opened = 0, ok = 1;
    while (ok && opened < job->parts) {
        ok = open_sized(job, first + opened, &job->fds[opened]);
        if (job->fds[opened] >= 0) {
            opened++;
        }
    }
    for (Py_ssize_t p = 0; ok && p < job->parts; p++) {
        ok = read_object(job, first + p, job->fds[p]);
    }
    for (Py_ssize_t p = 0; p < opened; p++) {
        close(job->fds[p]);
    }
}

/* Encode the paths and hold the buffers; -1 with an exception set (what was taken is kept in
 * the job, for release_job). */
static int take_args(job_t *job, PyObject *paths, PyObject *buffers) {
    for (Py_ssize_t k = 0; k < job->n; k++) {
        if (!PyUnicode_Check(PyList_GET_ITEM(paths, k))) {
            PyErr_Format(PyExc_TypeError, "paths must hold str, got %.80s",
                         Py_TYPE(PyList_GET_ITEM(paths, k))->tp_name);
            return -1;
        }
        if (!PyUnicode_FSConverter(PyList_GET_ITEM(paths, k), &job->paths[k])) {
            return -1;
        }
    }
    for (Py_ssize_t b = 0; b < 2 * job->n; b++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(buffers, b), &job->views[b],
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            job->views[b].obj = NULL;
            return -1;
        }
    }
    for (Py_ssize_t k = 0; k < job->n; k++) {
        if (job->views[2 * k].len + job->views[2 * k + 1].len != job->stored) {
            PyErr_Format(PyExc_ValueError, "buffers of object %zd hold %zd bytes, stored is %zd",
                         k, job->views[2 * k].len + job->views[2 * k + 1].len, job->stored);
            return -1;
        }
    }
    return 0;
}

static void release_job(job_t *job) {
    for (Py_ssize_t k = 0; job->paths && k < job->n; k++) {
        Py_XDECREF(job->paths[k]);
    }
    for (Py_ssize_t b = 0; job->views && b < 2 * job->n; b++) {
        if (job->views[b].obj != NULL) {
            PyBuffer_Release(&job->views[b]);
        }
    }
    PyMem_Free(job->paths);
    PyMem_Free(job->views);
    PyMem_Free(job->results);
    PyMem_Free(job->fds);
}

static PyObject *results_list(const job_t *job) {
    PyObject *out = PyList_New(job->n);
    for (Py_ssize_t k = 0; out != NULL && k < job->n; k++) {
        const result_t *r = &job->results[k];
        PyObject *item = Py_BuildValue("(LLL)", r->step, r->value, r->touch);
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, item);
    }
    return out;
}

static int check_shape(PyObject *paths, PyObject *buffers, Py_ssize_t stored, Py_ssize_t parts) {
    if (!PyList_CheckExact(paths) || !PyList_CheckExact(buffers)) {
        PyErr_SetString(PyExc_TypeError, "paths and buffers must be lists");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(paths);
    if (parts < 1 || stored < 0 || n % parts != 0 || PyList_GET_SIZE(buffers) != 2 * n) {
        PyErr_Format(PyExc_ValueError,
                     "read_pages needs parts >= 1 dividing len(paths) (%zd), stored >= 0 and two "
                     "buffers per path, got parts %zd, stored %zd, %zd buffers",
                     n, parts, stored, PyList_GET_SIZE(buffers));
        return -1;
    }
    return 0;
}

static PyObject *read_pages(PyObject *self, PyObject *args) {
    PyObject *paths, *buffers;
    Py_ssize_t stored, parts;
    long long stale_ns;
    if (!PyArg_ParseTuple(args, "OOnnL:read_pages", &paths, &buffers, &stored, &parts, &stale_ns)
        || check_shape(paths, buffers, stored, parts) < 0) {
        return NULL;
    }
    job_t job = {PyList_GET_SIZE(paths), parts, stored, stale_ns, NULL, NULL, NULL, NULL};
    job.paths = PyMem_Calloc((size_t)job.n + 1, sizeof(PyObject *));
    job.views = PyMem_Calloc(2 * (size_t)job.n + 1, sizeof(Py_buffer));
    job.results = PyMem_Calloc((size_t)job.n + 1, sizeof(result_t));
    job.fds = PyMem_Calloc((size_t)parts, sizeof(int));
    PyObject *out = NULL;
    if (!job.paths || !job.views || !job.results || !job.fds) {
        PyErr_NoMemory();
    } else if (take_args(&job, paths, buffers) == 0) {
        Py_BEGIN_ALLOW_THREADS;
        for (Py_ssize_t first = 0; first < job.n; first += parts) {
            read_page(&job, first);
        }
        Py_END_ALLOW_THREADS;
        out = results_list(&job);
    }
    release_job(&job);
    return out;
}

static PyMethodDef cfile_methods[] = {
    {"read_pages", read_pages, METH_VARARGS,
     "read_pages(paths, buffers, stored, parts, stale_ns) -> list of (step, value, touch): "
     "open, size-check, touch and readv page objects with the GIL released"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cfile_module = {
    PyModuleDef_HEAD_INIT, "hicache.backends.cfile",
    "The file store's page reads with the GIL released (hicache/backends/file_read.py).", -1,
    cfile_methods,
};

PyMODINIT_FUNC PyInit_cfile(void) { return PyModule_Create(&cfile_module); }

// The remote-cache fixture's module: plain C API (no pybind11), so the whole fixture compiles in seconds.
#include <Python.h>
#include "remote.h"

#define REMOTE_STR_(x) #x
#define REMOTE_STR(x) REMOTE_STR_(x)
#define REMOTE_CAT_(a, b) a##b
#define REMOTE_CAT(a, b) REMOTE_CAT_(a, b)

static PyObject* values(PyObject*, PyObject*) {
    return Py_BuildValue("(iL)", kernel_value(), table_sum());
}

static PyMethodDef methods[] = {{"values", values, METH_NOARGS, "fixture values"}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, REMOTE_STR(TORCH_EXTENSION_NAME), nullptr, -1,
                                        methods, nullptr, nullptr, nullptr, nullptr};

PyMODINIT_FUNC REMOTE_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module_def); }

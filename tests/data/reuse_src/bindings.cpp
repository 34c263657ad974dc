// A plain C-API module (no pybind11, so the fixture compiles in a second).
#include <Python.h>
#include "util.h"

int host_value();
int kernel_value();
int other_value();
int named_value();
const char* build_time();

#define HERMETIC_STR_(x) #x
#define HERMETIC_STR(x) HERMETIC_STR_(x)
#define HERMETIC_CAT_(a, b) a##b
#define HERMETIC_CAT(a, b) HERMETIC_CAT_(a, b)

static PyObject* values(PyObject*, PyObject*) {
    return Py_BuildValue("(iiiis)", host_value(), kernel_value(), other_value(), named_value(), build_time());
}

static PyMethodDef methods[] = {{"values", values, METH_NOARGS, "fixture values"}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, HERMETIC_STR(TORCH_EXTENSION_NAME), nullptr, -1,
                                        methods, nullptr, nullptr, nullptr, nullptr};

PyMODINIT_FUNC HERMETIC_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module_def); }

// A plain C-API module (no pybind11, so it compiles in a moment); named after TORCH_EXTENSION_NAME, so
// every variant compiles its own.
#include <Python.h>

long heavy_value();
long light_a();
long light_b();
#ifdef WITH_COMPUTED
long computed_value();
#else
static long computed_value() { return 0; }
#endif

#define JOINT_STR_(x) #x
#define JOINT_STR(x) JOINT_STR_(x)
#define JOINT_CAT_(a, b) a##b
#define JOINT_CAT(a, b) JOINT_CAT_(a, b)

static PyObject* values(PyObject*, PyObject*) {
    return Py_BuildValue("(llll)", heavy_value(), light_a(), light_b(), computed_value());
}

static PyMethodDef methods[] = {{"values", values, METH_NOARGS, "fixture values"}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, JOINT_STR(TORCH_EXTENSION_NAME), nullptr, -1,
                                        methods, nullptr, nullptr, nullptr, nullptr};

PyMODINIT_FUNC JOINT_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module_def); }

"""Prints what CMake needs to build TeraIO's PyTorch binding against the installed torch.

One `key=value` line each; run by cmake/TeraioTorch.cmake with the chosen interpreter.
"""
import os
import sysconfig

import torch

root = os.path.dirname(torch.__file__)
include = os.path.join(root, "include")
# PyTorch wheels bundle the pybind11 they were built with; Debian's torch uses the system
# pybind11 (pybind11-dev). Building against the same one keeps the two modules compatible.
if os.path.isdir(os.path.join(include, "pybind11")):
    pybind11_include = include
else:
    try:
        import pybind11

        pybind11_include = pybind11.get_include()
    except ImportError:
        pybind11_include = "/usr/include"
fields = {
    "version": torch.__version__.split("+")[0],
    "root": root,
    "include": "|".join([include, os.path.join(include, "torch", "csrc", "api", "include")]),
    "lib": os.path.join(root, "lib"),
    "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
    "cuda": torch.version.cuda or "",
    "python_include": sysconfig.get_paths()["include"],
    "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
    "pybind11_include": pybind11_include,
}
for key, value in fields.items():
    print(f"{key}={value}")

# Finds what the Python module (python/, `import distca`) builds against and defines
# DISTCA_PYTHON: ON by default when Debian's python3 (its headers) and pybind11 are found
# (and no sanitizer is on).
#
# The interpreter is /usr/bin/python3 unless -DPython_EXECUTABLE=... says otherwise: the
# python3 first on PATH may be another installation (pyenv) without Debian's pybind11 and
# NumPy, and a module built for one interpreter does not import in another.
# Included before the layers: with the module on, every static layer library is compiled as
# position-independent code so it can be linked into the shared module.
include_guard(GLOBAL)

if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Interpreter the distca Python module is built for")
endif()
find_package(Python 3.8 QUIET COMPONENTS Interpreter Development.Module)
set(_distca_python_default OFF)
# A sanitized module cannot be loaded by an unsanitized interpreter (the runtime must come
# first), so sanitizer builds leave it out by default.
if(Python_FOUND AND NOT DISTCA_SANITIZE_ADDRESS AND NOT DISTCA_SANITIZE_THREAD)
  set(PYBIND11_FINDPYTHON ON)
  find_package(pybind11 2.6 CONFIG QUIET)
  if(pybind11_FOUND)
    set(_distca_python_default ON)
  endif()
endif()
option(DISTCA_PYTHON "Build the Python module distca (pybind11, for Python_EXECUTABLE)" ${_distca_python_default})
if(DISTCA_PYTHON)
  if(NOT Python_FOUND OR NOT pybind11_FOUND)
    message(FATAL_ERROR "DISTCA_PYTHON is ON but ${Python_EXECUTABLE} with its headers (python3-dev) and "
                        "pybind11 (pybind11-dev) were not both found; run scripts/install-deps.sh or "
                        "configure with -DDISTCA_PYTHON=OFF")
  endif()
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  message(STATUS "distca Python module: ON (${Python_EXECUTABLE}, Python ${Python_VERSION}, pybind11 ${pybind11_VERSION})")
else()
  message(STATUS "distca Python module: OFF")
endif()

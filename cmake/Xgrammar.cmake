# The grammar library (xgrammar's C++ core: JSON Schema, regex, EBNF and structural-tag
# converters, the pushdown-automaton matcher and its token-mask cache), built as a static
# library from the source that scripts/fetch_xgrammar.sh fetches through pip. Our own target
# rather than its CMakeLists: that one builds the Python bindings unconditionally.
set(TESSERA_XGRAMMAR_DIR "${PROJECT_SOURCE_DIR}/.cache/xgrammar/xgrammar-0.2.8" CACHE PATH
    "xgrammar's unpacked source distribution (scripts/fetch_xgrammar.sh)")
if(NOT EXISTS "${TESSERA_XGRAMMAR_DIR}/include/xgrammar/xgrammar.h")
  message(FATAL_ERROR "xgrammar's source is not at TESSERA_XGRAMMAR_DIR=${TESSERA_XGRAMMAR_DIR}: "
                      "run scripts/fetch_xgrammar.sh (scripts/build.sh does)")
endif()
file(GLOB_RECURSE TESSERA_XGRAMMAR_SOURCES CONFIGURE_DEPENDS "${TESSERA_XGRAMMAR_DIR}/cpp/*.cc")
# The Python (TVM FFI) bindings are not part of the core.
list(FILTER TESSERA_XGRAMMAR_SOURCES EXCLUDE REGEX "/cpp/tvm_ffi/")
add_library(tessera_xgrammar STATIC ${TESSERA_XGRAMMAR_SOURCES})
target_include_directories(tessera_xgrammar SYSTEM PUBLIC "${TESSERA_XGRAMMAR_DIR}/include"
                           "${TESSERA_XGRAMMAR_DIR}/3rdparty/picojson" "${TESSERA_XGRAMMAR_DIR}/3rdparty/dlpack/include")
target_compile_definitions(tessera_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
# Its own language level; third-party code: its warnings are not ours to fix (-w), and the
# sanitizer builds check our code, not its (an uninstrumented library links into them fine).
set_target_properties(tessera_xgrammar PROPERTIES CXX_STANDARD 17)
target_compile_options(tessera_xgrammar PRIVATE -w -fno-sanitize=all)
target_link_libraries(tessera_xgrammar PUBLIC Threads::Threads)

# sdk.exported_symbols (Linux): the shared library exports the public API and
# nothing else (issue 26 item 9). Reads `nm -D --defined-only` of LIB and
# fails on
#  - any strong symbol (code or data of the library itself: nm types T, D, B,
#    R, ...) that is not part of a class, struct or function a public header
#    (HEADERS_DIR/im/*.h) marks IM_SDK_EXPORT, or the namespace im's
#    meta-object (Q_NAMESPACE_EXPORT);
#  - any weak or unique symbol (W, V, u: ELF's vague linkage, the template
#    instantiations of the C++ library and Qt that every shared object using
#    them exports, e.g. std::_Rb_tree<...> or QMetaType::registerConverter<
#    QList<im::OutboxEntry>>) that names a type of namespace im other than
#    the API's: an internal type must never reach the dynamic symbol table.
# Inputs: LIB (the built libimsdk.so), HEADERS_DIR (sdk/include), NM.
cmake_policy(SET CMP0057 NEW)
if(NOT EXISTS "${LIB}")
  message(FATAL_ERROR "no library at ${LIB}")
endif()

# The API, from the headers: `class IM_SDK_EXPORT Name`, `struct
# IM_SDK_EXPORT Name`, and free functions `IM_SDK_EXPORT Type name(`.
file(GLOB _headers "${HEADERS_DIR}/im/*.h")
set(_api "")
foreach(h ${_headers})
  file(READ "${h}" _text)
  string(REGEX MATCHALL "(class|struct)[ \t]+IM_SDK_EXPORT[ \t]+[A-Za-z_][A-Za-z0-9_]*" _types "${_text}")
  foreach(t ${_types})
    string(REGEX REPLACE ".*[ \t]([A-Za-z_][A-Za-z0-9_]*)$" "\\1" t "${t}")
    list(APPEND _api "${t}")
  endforeach()
  string(REGEX MATCHALL "\nIM_SDK_EXPORT[ \t]+[A-Za-z_:<>]+[ \t*&]+[A-Za-z_][A-Za-z0-9_]*\\(" _funcs "${_text}")
  foreach(f ${_funcs})
    string(REGEX REPLACE ".*[ \t*&]([A-Za-z_][A-Za-z0-9_]*)\\($" "\\1" f "${f}")
    list(APPEND _api "${f}")
  endforeach()
  if(_text MATCHES "Q_NAMESPACE_EXPORT\\(IM_SDK_EXPORT\\)")
    list(APPEND _api "staticMetaObject" "qt_getEnumMetaObject" "qt_getEnumName")
  endif()
endforeach()
list(REMOVE_DUPLICATES _api)
list(LENGTH _api _n)
if(_n LESS 4)
  message(FATAL_ERROR "found only ${_n} exported names in the public headers: ${_api}")
endif()
list(JOIN _api "|" _names)
# What a public name may appear as: itself or a member (im::Client::send),
# its vtable, type info or thunks.
set(_allowed "^((vtable|typeinfo|typeinfo name|VTT|construction vtable) for |(non-)?virtual thunk to |guard variable for )?im::(${_names})($|::|\\(| )")
# Symbols the linker itself defines in every shared object.
set(_linker "^(_init|_fini|_edata|_end|__bss_start)$")

execute_process(COMMAND "${NM}" -D --defined-only -C "${LIB}"
                OUTPUT_VARIABLE _out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIB} failed: ${rc}")
endif()
string(REPLACE "\n" ";" _lines "${_out}")
set(_bad "")
set(_good 0)
foreach(line ${_lines})
  if(line STREQUAL "")
    continue()
  endif()
  # "ADDRESS TYPE NAME" (the name may contain spaces)
  string(REGEX REPLACE "^[0-9a-fA-F]+ ([A-Za-z]) .*" "\\1" type "${line}")
  string(REGEX REPLACE "^[0-9a-fA-F]+ [A-Za-z] " "" name "${line}")
  if(name MATCHES "${_linker}")
    continue()
  endif()
  if(name MATCHES "${_allowed}")
    math(EXPR _good "${_good} + 1")
  elseif(type MATCHES "^[WVu]$")
    # Vague linkage: allowed unless it names an im:: type outside the API.
    string(REGEX MATCHALL "im::[A-Za-z_][A-Za-z0-9_]*" _used "${name}")
    foreach(u ${_used})
      string(REGEX REPLACE "^im::" "" u "${u}")
      if(NOT u IN_LIST _api)
        string(APPEND _bad "\n  ${line}")
        break()
      endif()
    endforeach()
  else()
    string(APPEND _bad "\n  ${line}")
  endif()
endforeach()
if(_bad)
  message(FATAL_ERROR "libimsdk exports symbols outside the public API (${_api}):${_bad}")
endif()
if(_good LESS 20)
  message(FATAL_ERROR "only ${_good} API symbols exported: is this the SDK library?")
endif()
message(STATUS "${_good} exported symbols, all of the public API (${_api})")

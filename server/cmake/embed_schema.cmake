# Generates a C++ source holding the schema: every schema/NNN_name.sql (the
# numbered, append-only migrations, in version order; numbers may have gaps),
# every schema/functions/NAME.sql (applied with CREATE OR REPLACE over an
# older function set) and schema/functions/versions.txt (the function set's
# versions, checked here against the files). Inputs: SCHEMA_DIR, OUT.
# NEXT_MARKER (tests only: the "next build" of tests/server): im_send gets
# the comment "-- NEXT_MARKER" in its body and the set one version more.
set(im_sql_begin "R\"im_sql(")
set(im_sql_end ")im_sql\"")

file(GLOB migration_files "${SCHEMA_DIR}/[0-9][0-9][0-9]_*.sql")
list(SORT migration_files)
set(migrations "")
foreach(f IN LISTS migration_files)
  get_filename_component(name "${f}" NAME_WE)
  file(READ "${f}" sql)
  string(SUBSTRING "${name}" 0 3 ver)
  math(EXPR ver "${ver}")
  string(APPEND migrations "        {${ver}, \"${name}\", ${im_sql_begin}${sql}${im_sql_end}},\n")
endforeach()

# The function files, with their checksums (SHA-256 of the text, as
# migrations.cpp's schema_checksum computes it).
file(GLOB function_files "${SCHEMA_DIR}/functions/*.sql")
list(SORT function_files)
set(functions "")
set(file_lines "") # "NAME SHA256" of each file, in name order
foreach(f IN LISTS function_files)
  get_filename_component(name "${f}" NAME_WE)
  file(READ "${f}" sql)
  if(DEFINED NEXT_MARKER AND name STREQUAL "im_send")
    # im_send's own body: the file holds other functions before it (im_lock_runs)
    string(FIND "${sql}" "FUNCTION im_send(" fn)
    if(fn LESS 0)
      message(FATAL_ERROR "im_send.sql does not define im_send for the next build's marker")
    endif()
    string(SUBSTRING "${sql}" ${fn} -1 from_fn)
    string(FIND "${from_fn}" "BEGIN\n" at)
    if(at LESS 0)
      message(FATAL_ERROR "im_send.sql has no 'BEGIN' line in im_send for the next build's marker")
    endif()
    math(EXPR at "${fn} + ${at} + 6")
    string(SUBSTRING "${sql}" 0 ${at} head)
    string(SUBSTRING "${sql}" ${at} -1 tail)
    set(sql "${head}    -- ${NEXT_MARKER}\n${tail}")
  endif()
  string(SHA256 sum "${sql}")
  list(APPEND file_lines "${name} ${sum}")
  string(APPEND functions "        {\"${name}\", ${im_sql_begin}${sql}${im_sql_end}},\n")
endforeach()

# versions.txt: consecutive versions from 1, each listing its whole set;
# the files must be the highest version's.
set(versions_file "${SCHEMA_DIR}/functions/versions.txt")
file(STRINGS "${versions_file}" version_lines)
set(top 0)
set(top_lines "")
set(history "")
foreach(line IN LISTS version_lines)
  if(line MATCHES "^[ \t]*(#|$)")
    continue()
  endif()
  if(NOT line MATCHES "^([0-9]+) ([A-Za-z0-9_]+) ([0-9a-f]+)$")
    message(FATAL_ERROR "schema/functions/versions.txt: '${line}' is not 'VERSION NAME SHA256'")
  endif()
  set(v "${CMAKE_MATCH_1}")
  set(n "${CMAKE_MATCH_2}")
  set(s "${CMAKE_MATCH_3}")
  string(LENGTH "${s}" len)
  if(NOT len EQUAL 64)
    message(FATAL_ERROR "schema/functions/versions.txt: '${line}': the checksum is not 64 hex digits")
  endif()
  math(EXPR next "${top} + 1")
  if(v EQUAL next)
    set(top ${v})
    set(top_lines "")
  elseif(NOT v EQUAL top)
    message(FATAL_ERROR "schema/functions/versions.txt: version ${v} after ${top}: versions go 1, 2, 3 ... in order")
  endif()
  list(APPEND top_lines "${n} ${s}")
  string(APPEND history "        {${v}, \"${n}\", \"${s}\"},\n")
endforeach()
if(top EQUAL 0)
  message(FATAL_ERROR "schema/functions/versions.txt records no version")
endif()
list(SORT top_lines)
if(NOT top_lines STREQUAL file_lines AND NOT DEFINED NEXT_MARKER)
  math(EXPR next "${top} + 1")
  # (indented: CMake leaves indented lines of a message unwrapped)
  string(REPLACE ";" "\n  ${next} " wanted "  ${next} ${file_lines}")
  message(FATAL_ERROR
    "schema/functions/*.sql differ from version ${top} of the function set in schema/functions/versions.txt.\n"
    "A changed function file is a new version of the set (docs/operations.md, \"The function set's version\"): "
    "append these lines to schema/functions/versions.txt (or, if version ${top} was never released, "
    "replace its lines with them and keep its number):\n${wanted}\n")
endif()
if(DEFINED NEXT_MARKER)
  math(EXPR top "${top} + 1")
  foreach(fl IN LISTS file_lines)
    string(REPLACE " " "\", \"" fl "${fl}")
    string(APPEND history "        {${top}, \"${fl}\"},\n")
  endforeach()
endif()

file(WRITE "${OUT}.tmp" "// Generated from schema/ by cmake/embed_schema.cmake. Do not edit.
#include \"store/migrations.hpp\"

namespace im {

const std::vector<Migration>& all_migrations() {
    static const std::vector<Migration> list = {
${migrations}    };
    return list;
}

const std::vector<SchemaFunction>& all_functions() {
    static const std::vector<SchemaFunction> list = {
${functions}    };
    return list;
}

const std::vector<FunctionSetEntry>& function_set_history() {
    static const std::vector<FunctionSetEntry> list = {
${history}    };
    return list;
}

} // namespace im
")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")

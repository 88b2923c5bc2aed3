# Generates a C++ source holding the schema: every schema/NNN_name.sql (the
# numbered, append-only migrations, in version order; numbers may have gaps)
# and every schema/functions/NAME.sql (applied with CREATE OR REPLACE
# whenever its checksum changes). Inputs: SCHEMA_DIR, OUT.
function(im_embed_list glob out_var with_version)
  file(GLOB files "${glob}")
  list(SORT files)
  set(body "")
  foreach(f IN LISTS files)
    get_filename_component(name "${f}" NAME_WE)
    file(READ "${f}" sql)
    if(with_version)
      string(SUBSTRING "${name}" 0 3 ver)
      math(EXPR ver "${ver}")
      string(APPEND body "        {${ver}, \"${name}\", R\"im_sql(${sql})im_sql\"},\n")
    else()
      string(APPEND body "        {\"${name}\", R\"im_sql(${sql})im_sql\"},\n")
    endif()
  endforeach()
  set(${out_var} "${body}" PARENT_SCOPE)
endfunction()
im_embed_list("${SCHEMA_DIR}/[0-9][0-9][0-9]_*.sql" migrations ON)
im_embed_list("${SCHEMA_DIR}/functions/*.sql" functions OFF)
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

} // namespace im
")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")

# Generates a C++ source holding every schema/NNN_name.sql, in order.
# Inputs: SCHEMA_DIR, OUT.
file(GLOB files "${SCHEMA_DIR}/[0-9][0-9][0-9]_*.sql")
list(SORT files)
set(body "")
foreach(f IN LISTS files)
  get_filename_component(name "${f}" NAME_WE)
  string(SUBSTRING "${name}" 0 3 ver)
  math(EXPR ver "${ver}")
  file(READ "${f}" sql)
  string(APPEND body "        {${ver}, \"${name}\", R\"im_sql(${sql})im_sql\"},\n")
endforeach()
file(WRITE "${OUT}.tmp" "// Generated from schema/*.sql by cmake/embed_schema.cmake. Do not edit.\n#include \"migrations.hpp\"\n\nnamespace im {\n\nconst std::vector<Migration>& all_migrations() {\n    static const std::vector<Migration> list = {\n${body}    };\n    return list;\n}\n\n} // namespace im\n")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")

// The option table's row type and the helpers its rows use, shared by the
// three files of the configuration: config_options.cpp (the table),
// config.cpp (reading flags, the environment and the file) and
// config_render.cpp (--help, --print-config, the manual pages). Private to
// core/.
#pragma once

#include "core/config.hpp"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace im::config_detail {

enum : unsigned { for_gateway = 1, for_admin = 2, for_both = 3 };

struct Option {
    const char* flag;
    const char* env;       // nullptr: flag only
    const char* arg;       // nullptr: a switch
    const char* help;
    std::function<std::optional<std::string>(Config&, const std::string&)> set;
    // The effective value for --print-config ("" = unset); switches print
    // true/false. Missing: print-config shows the raw value that was set.
    std::function<std::string(const Config&)> get = {};
    unsigned scope = for_gateway;
    bool in_file = true;   // false: flag and environment only (--config)
};

/// Every option, in the order --help lists them.
const std::vector<Option>& options();

unsigned scope_bit(ConfigScope s);

/// The key in the configuration file: the flag without its dashes.
std::string key_of(const Option& o);

std::optional<std::string> to_int(const std::string& s, int lo, int hi, int& out);
/// Switch values: a bare flag means "1"; files and the environment spell it.
std::optional<std::string> to_bool(const std::string& v, bool& out);
std::string yes_no(bool b);
std::string trim(const std::string& s);
std::string join(const std::vector<std::string>& v);

} // namespace im::config_detail

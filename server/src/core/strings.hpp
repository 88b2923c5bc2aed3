// Small string helpers the layers share (header only).
#pragma once

#include <string>
#include <vector>

namespace im {

/// "a,b,,c" -> {"a", "b", "c"}: the comma-separated items, empty ones dropped
/// (command-line lists, env values, array_to_string(..., ',') columns).
inline std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> out;
    std::string::size_type start = 0;
    while (start <= s.size()) {
        auto comma = s.find(',', start);
        if (comma == std::string::npos) comma = s.size();
        if (comma > start) out.push_back(s.substr(start, comma - start));
        start = comma + 1;
    }
    return out;
}

} // namespace im

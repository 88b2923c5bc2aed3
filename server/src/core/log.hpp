// One JSON object per line on stderr: {"ts":...,"level":...,"msg":...,...}.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace im {

struct LogField {
    std::string key;
    std::string value;     // emitted as a JSON string unless numeric
    bool numeric = false;
    LogField(std::string k, std::string v) : key(std::move(k)), value(std::move(v)) {}
    LogField(std::string k, const char* v) : key(std::move(k)), value(v) {}
    LogField(std::string k, std::string_view v) : key(std::move(k)), value(v) {}
    LogField(std::string k, long long v) : key(std::move(k)), value(std::to_string(v)), numeric(true) {}
    LogField(std::string k, long v) : key(std::move(k)), value(std::to_string(v)), numeric(true) {}
    LogField(std::string k, int v) : key(std::move(k)), value(std::to_string(v)), numeric(true) {}
    LogField(std::string k, unsigned long v) : key(std::move(k)), value(std::to_string(v)), numeric(true) {}
};

void set_log_gateway(std::string gateway);
void set_log_quiet(bool quiet); // tests: only warnings and errors
void log_line(std::string_view level, std::string_view msg, std::initializer_list<LogField> fields);
inline void log_info(std::string_view msg, std::initializer_list<LogField> f = {}) { log_line("info", msg, f); }
inline void log_warn(std::string_view msg, std::initializer_list<LogField> f = {}) { log_line("warn", msg, f); }
inline void log_error(std::string_view msg, std::initializer_list<LogField> f = {}) { log_line("error", msg, f); }

} // namespace im

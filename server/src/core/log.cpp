#include "core/log.hpp"

#include <boost/json.hpp>

#include <chrono>
#include <cstdio>
#include <mutex>

namespace im {

namespace {
std::mutex mu;
std::string gateway_id;
bool quiet = false;
} // namespace

void set_log_gateway(std::string gateway) {
    std::lock_guard lk(mu);
    gateway_id = std::move(gateway);
}

void set_log_quiet(bool q) {
    std::lock_guard lk(mu);
    quiet = q;
}

void log_line(std::string_view level, std::string_view msg, std::initializer_list<LogField> fields) {
    namespace json = boost::json;
    auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
    json::object o;
    o["ts"] = now;
    o["level"] = level;
    o["msg"] = msg;
    std::lock_guard lk(mu);
    if (quiet && level == "info") return;
    if (!gateway_id.empty()) o["gateway"] = gateway_id;
    for (const auto& f : fields) {
        if (f.numeric) o[f.key] = std::stoll(f.value);
        else o[f.key] = f.value;
    }
    std::string line = json::serialize(o);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
}

} // namespace im

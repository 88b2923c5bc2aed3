// What the WebSocket benchmarks (im_loadgen, im_storm) share: percentiles,
// the CPU seconds of a process and of a PostgreSQL cluster from /proc, and
// waiting for a condition. Header-only; nothing here asserts.
#pragma once

#include "store/database.hpp"
#include "harness.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

namespace im::bench {

/// Latency samples (ms); pct() sorts them.
struct Samples {
    std::vector<double> v;
    double pct(double p) {
        if (v.empty()) return 0;
        std::sort(v.begin(), v.end());
        auto i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
        return v[std::min(i, v.size() - 1)];
    }
};

/// The fields of /proc/PID/stat after the command name (field 3, the state,
/// first); empty once the process is gone.
inline std::vector<std::string> stat_fields(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), {});
    auto close = s.rfind(')');
    std::vector<std::string> out;
    if (close == std::string::npos) return out;
    std::istringstream in(s.substr(close + 2));
    for (std::string field; in >> field;) out.push_back(field);
    return out;
}

/// CPU seconds (user + system, fields 14 and 15) of a process; 0 once it is gone.
inline double cpu_seconds(pid_t pid) {
    const auto f = stat_fields(pid);
    if (f.size() < 13) return 0;
    return (std::atof(f[11].c_str()) + std::atof(f[12].c_str())) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

/// The parent (field 4) of a process; 0 once it is gone.
inline pid_t parent_of(pid_t pid) {
    const auto f = stat_fields(pid);
    return f.size() < 2 ? 0 : static_cast<pid_t>(std::atoi(f[1].c_str()));
}

/// The postmaster and all its children (backends that exited no longer count).
inline double postgres_cpu(pid_t postmaster) {
    double total = cpu_seconds(postmaster);
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
        pid_t p = std::atoi(e.path().filename().c_str());
        if (p > 0 && parent_of(p) == postmaster) total += cpu_seconds(p);
    }
    return total;
}

/// The postmaster of the cluster behind `url`.
inline pid_t postmaster_pid(const std::string& url) {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    auto dir = tx.exec("SHOW data_directory")[0][0].as<std::string>();
    std::ifstream f(dir + "/postmaster.pid");
    pid_t pid = 0;
    f >> pid;
    return pid;
}

/// CPU seconds of this process.
inline double self_cpu() {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/// The shared wait (tests/support/harness.hpp).
using test::wait_until;

/// Raises this process's descriptor limit to its hard limit (and further
/// when root may): children (imserver) inherit it.
inline void raise_descriptor_limit(rlim_t want_at_least) {
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    rlimit want = rl;
    want.rlim_max = std::max<rlim_t>(rl.rlim_max, want_at_least);
    want.rlim_cur = want.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) != 0) {
        rl.rlim_cur = rl.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/// argv[i + 1], the value of the flag argv[i] (i moves on to it); exits 2
/// naming the flag when there is none.
inline std::string flag_value(int argc, char** argv, int& i) {
    if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
    }
    return argv[++i];
}

/// The benchmark's database with the schema applied: `url` (--db), or a
/// cluster in a temporary folder configured exactly as imserver configures
/// its embedded one, stopped on destruction.
class BenchDatabase {
public:
    BenchDatabase(const std::optional<std::string>& url, const std::string& prefix)
        : state_(prefix), db_(im::open_database(url, state_.path())) {}
    ~BenchDatabase() {
        if (db_.cluster) db_.cluster->stop();
    }
    BenchDatabase(const BenchDatabase&) = delete;
    BenchDatabase& operator=(const BenchDatabase&) = delete;
    im::Database& db() { return db_; }
    const std::string& url() const { return db_.url; }
    void prepare_schema() { im::prepare_schema(db_.url); }

private:
    im::test::TempDir state_;
    im::Database db_;
};

} // namespace im::bench

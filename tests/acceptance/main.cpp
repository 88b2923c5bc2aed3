// im_acceptance: runs every check id of spec/acceptance.md and prints
// `PASS id (detail)` / `FAIL id (detail)`, then `N passed, M failed`.
// Exit status 1 on any failure. Writes a JSON report to $IM_ACCEPTANCE_REPORT
// (default: acceptance-report.json next to this binary).
//
//   im_acceptance [ID-PREFIX ...]   run only the checks whose id starts so
#include "lab.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <cstdlib>

#include <signal.h>
#include <unistd.h>

namespace {

using namespace im::lab;
using Clock = std::chrono::steady_clock;

struct Result {
    std::string id;
    bool pass;
    std::string detail;
    long long ms;
};

std::string report_path() {
    if (const char* p = std::getenv("IM_ACCEPTANCE_REPORT"); p && *p) return p;
    std::error_code ec;
    auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string("acceptance-report.json") : (exe.parent_path() / "acceptance-report.json").string();
}

std::mutex report_mu;
std::vector<Result> results;
auto started = Clock::now();

void write_report(const std::vector<std::string>& not_run) {
    std::lock_guard lk(report_mu);
    json::array checks;
    int ok = 0, bad = 0;
    for (const auto& r : results) {
        (r.pass ? ok : bad)++;
        checks.push_back(json::object{{"id", r.id}, {"verdict", r.pass ? "PASS" : "FAIL"}, {"detail", r.detail},
                                      {"ms", r.ms}});
    }
    json::array skipped;
    for (const auto& id : not_run) skipped.push_back(json::value(id));
    json::object doc{{"suite", "acceptance"},
                     {"passed", ok},
                     {"failed", bad + static_cast<int>(not_run.size())},
                     {"not_run", skipped},
                     {"duration_ms",
                      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count()},
                     {"checks", checks}};
    std::ofstream f(report_path(), std::ios::trunc);
    f << json::serialize(doc) << '\n';
}

// A crash or Ctrl-C of the lab must not leave imserver / PostgreSQL behind
// (they would also keep our stdout pipe open). Best effort, then die.
Lab* g_lab = nullptr;
extern "C" void on_fatal(int sig) {
    if (g_lab) g_lab->kill_all_tracked();
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}

void print(const Result& r) {
    std::printf("%s %s (%s)\n", r.pass ? "PASS" : "FAIL", r.id.c_str(), r.detail.c_str());
    std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
#ifdef IM_DEFAULT_IMSERVER_BIN
    ::setenv("IMSERVER_BIN", IM_DEFAULT_IMSERVER_BIN, 0);
#endif
#ifdef IM_DEFAULT_SDK_CHILD_BIN
    ::setenv("IM_SDK_CHILD_BIN", IM_DEFAULT_SDK_CHILD_BIN, 0);
#endif
    std::vector<std::string> only(argv + 1, argv + argc);
    std::vector<Check> all;
    for (auto list : {send_checks, fault_checks, sync_checks, device_checks, retention_checks})
        for (auto& c : list()) all.push_back(std::move(c));
    // The lab's own precondition first, then the ids in spec order.
    std::stable_partition(all.begin(), all.end(), [](const Check& c) { return c.id.rfind("lab-", 0) == 0; });
    if (!only.empty()) {
        std::vector<Check> picked;
        for (auto& c : all)
            for (const auto& p : only)
                if (c.id.rfind(p, 0) == 0) {
                    picked.push_back(c);
                    break;
                }
        all = std::move(picked);
    }

    std::unique_ptr<Lab> lab;
    try {
        lab = std::make_unique<Lab>();
    } catch (const std::exception& e) {
        std::printf("FAIL lab-setup (%s)\n0 passed, %zu failed\n", e.what(), all.size() + 1);
        return 1;
    }

    g_lab = lab.get();
    for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, on_fatal);

    // Watchdog: a check that hangs FAILs, the report is written, and the
    // processes the lab started are stopped, rather than hanging CI.
    const auto per_check = std::chrono::seconds(120);
    std::mutex wmu;
    std::condition_variable wcv;
    std::string current;
    Clock::time_point deadline = Clock::time_point::max();
    std::atomic<std::size_t> index{0};
    bool done = false;
    std::thread watchdog([&] {
        std::unique_lock lk(wmu);
        while (!done) {
            if (wcv.wait_until(lk, std::min(deadline, Clock::now() + 1s)) == std::cv_status::timeout &&
                Clock::now() >= deadline && !done) {
                Result r{current, false, "timed out after 120 s; lab aborted", 120000};
                print(r);
                {
                    std::lock_guard rl(report_mu);
                    results.push_back(r);
                }
                std::vector<std::string> rest;
                for (std::size_t i = index + 1; i < all.size(); ++i) rest.push_back(all[i].id);
                write_report(rest);
                int ok = 0;
                for (auto& x : results) ok += x.pass;
                std::printf("%d passed, %zu failed\n", ok, results.size() - ok + rest.size());
                std::fflush(stdout);
                lab->kill_all_tracked();
                ::_exit(1);
            }
        }
    });

    for (std::size_t i = 0; i < all.size(); ++i) {
        {
            std::lock_guard lk(wmu);
            index = i;
            current = all[i].id;
            deadline = Clock::now() + per_check;
        }
        auto t0 = Clock::now();
        Verdict v;
        try {
            v = all[i].run(*lab);
        } catch (const std::exception& e) {
            v = failed(e.what());
        }
        Result r{all[i].id, v.pass, v.detail,
                 std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()};
        print(r);
        std::lock_guard rl(report_mu);
        results.push_back(std::move(r));
    }
    {
        std::lock_guard lk(wmu);
        done = true;
        deadline = Clock::time_point::max();
    }
    wcv.notify_all();
    watchdog.join();

    write_report({});
    int ok = 0;
    for (auto& r : results) ok += r.pass;
    int bad = static_cast<int>(results.size()) - ok;
    std::printf("%d passed, %d failed\n", ok, bad);
    std::fflush(stdout);
    g_lab = nullptr;
    lab.reset();
    return bad == 0 ? 0 : 1;
}

// im_acceptance: runs every check id of spec/acceptance.md and prints
// `PASS id (detail)` / `FAIL id (detail)`, then `N passed, M failed`.
// Exit status 1 on any failure. Writes a JSON report to $IM_ACCEPTANCE_REPORT
// (default: acceptance-report.json next to this binary).
//
// A FAIL names the tag of the assertion that failed: `FAIL id (at TAG: ...)`,
// or `FAIL id (harness error: ...)` when the lab itself could not do its part.
// After each check that has a negative control, the control runs and must
// FAIL at exactly its control tag: `CONTROL id failed as expected at TAG (...)`;
// anything else is `CONTROL id DID NOT FAIL (failed at OTHER ...)`, `(passed ...)`
// or `(harness error: ...)`, which fails the run.
//
//   im_acceptance [--doc FILE] [ID-PREFIX ...]
//       --doc FILE: afterwards, rewrite FILE's "## Latest run" section from
//       this run's results (docs/acceptance.md; target acceptance_doc)
//       ID-PREFIX: run only the checks whose id starts so
//                                   (exit 2 when a prefix matches no id)
#include "lab.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ctime>
#include <iostream>
#include <sstream>

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
    bool control = false;     // a negative control's result: pass = it failed as expected
    std::string control_what; // what the control breaks
    std::string tag;          // the tag the check (or control) failed at; empty on a pass or harness error
    bool harness = false;     // a harness error, not a verdict
    std::string want_tag;     // a control: the tag it must fail at
};

// What ran: a verdict, or a harness error (any exception but CheckFailed).
struct Ran {
    Verdict v;
    bool harness = false;
};
// Details go on one line: newlines (a server's body, a child's output) become spaces.
std::string one_line(std::string s) {
    for (auto& ch : s)
        if (ch == '\n' || ch == '\r') ch = ' ';
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
}
Ran run_guarded(const std::function<Verdict(Lab&)>& f, Lab& lab) {
    Ran r;
    try {
        r = {f(lab), false};
    } catch (const CheckFailed& e) {
        r = {failed(e.tag, e.what()), false};
    } catch (const std::exception& e) {
        r = {failed({}, e.what()), true};
    }
    r.v.detail = one_line(std::move(r.v.detail));
    return r;
}

// The text in parentheses after PASS/FAIL/CONTROL.
std::string why(const Result& r) {
    if (!r.control) {
        if (r.pass) return r.detail;
        return r.harness ? "harness error: " + r.detail : "at " + r.tag + ": " + r.detail;
    }
    if (r.pass) return r.control_what + ": " + r.detail;
    if (r.harness) return "harness error: " + r.detail + "; wanted a failure at " + r.want_tag;
    if (r.tag.empty()) return "passed; wanted a failure at " + r.want_tag + "; " + r.control_what + ": " + r.detail;
    return "failed at " + r.tag + ", wanted " + r.want_tag + "; " + r.control_what + ": " + r.detail;
}

std::string line(const Result& r) {
    if (r.control)
        return "CONTROL " + r.id + (r.pass ? " failed as expected at " + r.tag : std::string(" DID NOT FAIL")) + " (" +
               why(r) + ")";
    return (r.pass ? "PASS " : "FAIL ") + r.id + " (" + why(r) + ")";
}

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
    json::array checks, controls;
    int ok = 0, bad = 0, controls_ok = 0, controls_bad = 0;
    for (const auto& r : results) {
        if (r.control) {
            (r.pass ? controls_ok : controls_bad)++;
            controls.push_back(json::object{{"id", r.id},
                                            {"verdict", r.pass ? "failed as expected" : "DID NOT FAIL"},
                                            {"want_tag", r.want_tag},
                                            {"tag", r.tag},
                                            {"harness_error", r.harness},
                                            {"breaks", r.control_what},
                                            {"detail", r.detail},
                                            {"ms", r.ms}});
            continue;
        }
        (r.pass ? ok : bad)++;
        checks.push_back(json::object{{"id", r.id}, {"verdict", r.pass ? "PASS" : "FAIL"}, {"tag", r.tag},
                                      {"harness_error", r.harness}, {"detail", r.detail}, {"ms", r.ms}});
    }
    json::array skipped;
    for (const auto& id : not_run) skipped.push_back(json::value(id));
    json::object doc{{"suite", "acceptance"},
                     {"passed", ok},
                     {"failed", bad + static_cast<int>(not_run.size())},
                     {"controls_failed_as_expected", controls_ok},
                     {"controls_did_not_fail", controls_bad},
                     {"not_run", skipped},
                     {"duration_ms",
                      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count()},
                     {"checks", checks},
                     {"controls", controls}};
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

// Rewrites the "## Latest run" section of docs/acceptance.md (everything
// from that heading on) from this run's results; the text above it is kept.
bool write_doc(const std::string& path, bool selected) {
    std::ifstream in(path);
    if (!in) return false;
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    const std::string heading = "## Latest run";
    auto at = text.find("\n" + heading);
    if (at == std::string::npos) return false;
    text.resize(at + 1);
    std::lock_guard lk(report_mu);
    int ok = 0, bad = 0, cok = 0, cbad = 0;
    for (const auto& r : results) {
        if (r.control) (r.pass ? cok : cbad)++;
        else (r.pass ? ok : bad)++;
    }
    char when[64];
    std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    auto secs = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - started).count();
    std::ostringstream o;
    o << heading << "\n\n"
      << "Generated by `im_acceptance --doc docs/acceptance.md` (the `acceptance_doc` build target) from the\n"
      << "results of the run itself, " << when << ", " << secs << " s"
      << (selected ? " (a selection of ids, not the whole lab)" : "") << ": " << ok << " passed, " << bad
      << " failed; " << cok << " negative controls failed as expected at their tag, " << cbad
      << " did not.\n\n```\n";
    for (const auto& r : results) o << line(r) << "\n";
    o << ok << " passed, " << bad << " failed\n"
      << cok << " controls failed as expected, " << cbad << " did not fail\n```\n";
    text += o.str();
    std::ofstream out(path, std::ios::trunc);
    out << text;
    return static_cast<bool>(out);
}

void print(const Result& r) {
    std::printf("%s\n", line(r).c_str());
    std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
    use_built_binaries();
    std::vector<std::string> only;
    std::string doc_path;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--doc") {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "im_acceptance: --doc needs a file\n");
                return 2;
            }
            doc_path = argv[++i];
        } else {
            only.push_back(a);
        }
    }
    std::vector<Check> all;
    for (auto list : {send_checks, fault_checks, sync_checks, device_checks, retention_checks, change_checks,
                      crash_checks, ephemeral_checks, moderation_checks, webhook_checks})
        for (auto& c : list()) all.push_back(std::move(c));
    // The lab's own precondition first, then the ids in spec order.
    std::stable_partition(all.begin(), all.end(), [](const Check& c) { return c.id == "lab-faults-off-by-default"; });
    // A control without the tag it must fail at could pass on any failure.
    for (const auto& c : all) {
        bool untagged = c.control && c.control_tag.empty();
        for (const auto& m : c.more) untagged = untagged || !m.run || m.tag.empty();
        if (untagged || (!c.more.empty() && !c.control)) {
            std::printf("FAIL lab-args (a control of %s names no control_tag)\n0 passed, 1 failed\n", c.id.c_str());
            return 2;
        }
    }
    if (!only.empty()) {
        // A prefix that selects nothing is a mistake (a typo would otherwise
        // "pass" with 0 checks run): fail before starting anything.
        for (const auto& p : only) {
            bool any = false;
            for (const auto& c : all) any = any || c.id.rfind(p, 0) == 0;
            if (!any) {
                std::printf("FAIL lab-args (no check id starts with '%s')\n0 passed, 1 failed\n", p.c_str());
                return 2;
            }
        }
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
                Result r{current, false, "timed out after 120 s; lab aborted", 120000, false, {}, {}, true, {}};
                print(r);
                {
                    std::lock_guard rl(report_mu);
                    results.push_back(r);
                }
                std::vector<std::string> rest;
                for (std::size_t i = index + 1; i < all.size(); ++i) rest.push_back(all[i].id);
                write_report(rest);
                int ok = 0, bad = 0;
                for (auto& x : results)
                    if (!x.control) (x.pass ? ok : bad)++;
                std::printf("%d passed, %zu failed\n", ok, bad + rest.size());
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
        auto ran = run_guarded(all[i].run, *lab);
        Result r{all[i].id, ran.v.pass, ran.v.detail,
                 std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(), false, {},
                 ran.v.tag, ran.harness, {}};
        print(r);
        {
            std::lock_guard rl(report_mu);
            results.push_back(std::move(r));
        }
        if (!all[i].control) continue;
        std::vector<Control> controls{{all[i].control, all[i].control_what, all[i].control_tag}};
        controls.insert(controls.end(), all[i].more.begin(), all[i].more.end());
        for (const auto& ctl : controls) {
            // The negative control: the same check with the guarded property
            // broken on purpose must FAIL at the assertion that guards it (its
            // control_tag). A pass, a failure at another tag (a timeout, a setup
            // step) or a harness error (a refused fault, any exception but the
            // check's own CheckFailed) is a control that proved nothing.
            {
                std::lock_guard lk(wmu);
                current = "CONTROL " + all[i].id;
                deadline = Clock::now() + per_check;
            }
            t0 = Clock::now();
            auto cran = run_guarded(ctl.run, *lab);
            Result c{all[i].id,
                     !cran.harness && !cran.v.pass && cran.v.tag == ctl.tag,
                     cran.v.detail,
                     std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(),
                     true,
                     ctl.what,
                     cran.v.tag,
                     cran.harness,
                     ctl.tag};
            print(c);
            std::lock_guard rl(report_mu);
            results.push_back(std::move(c));
        }
    }
    {
        std::lock_guard lk(wmu);
        done = true;
        deadline = Clock::time_point::max();
    }
    wcv.notify_all();
    watchdog.join();

    write_report({});
    int ok = 0, controls_ok = 0, controls = 0;
    for (auto& r : results) {
        if (r.control) {
            ++controls;
            controls_ok += r.pass;
        } else {
            ok += r.pass;
        }
    }
    int bad = static_cast<int>(results.size()) - controls - ok;
    std::printf("%d passed, %d failed\n", ok, bad);
    std::printf("%d controls failed as expected, %d did not fail\n", controls_ok, controls - controls_ok);
    if (!doc_path.empty() && !write_doc(doc_path, !only.empty())) {
        std::fprintf(stderr, "im_acceptance: could not rewrite the '## Latest run' section of %s\n", doc_path.c_str());
        bad += 1;
    }
    std::fflush(stdout);
    g_lab = nullptr;
    lab.reset();
    return bad == 0 && controls_ok == controls ? 0 : 1;
}

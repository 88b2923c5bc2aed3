// Push fan-out of a large group (docs/benchmarks.md, "Fan-out of a large
// group"): W subscribed members watch a group of M members (default 5,000)
// while one member sends; each message's push latency (send written ->
// push read by a watcher) is sampled at every watcher. The baseline in the
// same run is a group of only the watchers and the sender (W + 1 members),
// measured in alternating rounds on the same server, so the ratio shows
// what the silent members cost. Both groups get full `event` pushes
// (push_full_max raised): the figure compares membership sizes, not frame
// kinds.
//   bench_fanout [--members M] [--watchers W] [--messages N] [--rounds R] [--before PATH]
// --before: another imserver binary (e.g. main's), measured the same way
// after this one, for a before/after table.
#include "bench_support.hpp"
#include "exe_relative.hpp"
#include "harness.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

using namespace im::test;
using im::bench::Samples;
using clock_type = std::chrono::steady_clock;

namespace {

struct Setup {
    std::string big, small;
    TestUser sender;
    std::vector<TestUser> watchers;
};

// Users and both groups, made once; every server measured shares them.
Setup make_setup(const TestPostgres& pg, int members, int watchers) {
    Setup s;
    const std::string prefix = unique_name("fo");
    s.sender = make_user(pg.url(), prefix + "-sender");
    for (int i = 0; i < watchers; ++i) s.watchers.push_back(make_user(pg.url(), prefix + "-w" + std::to_string(i)));
    const int silent = members - watchers - 1;
    pg.scalar("INSERT INTO users (user_id) SELECT '" + prefix + "-m' || g FROM generate_series(1, " +
              std::to_string(std::max(silent, 0)) + ") g");
    std::string small = s.sender.user;
    for (const auto& w : s.watchers) small += "," + w.user;
    std::string big = small;
    for (int i = 1; i <= silent; ++i) big += "," + prefix + "-m" + std::to_string(i);
    s.small = prefix + "-small";
    s.big = prefix + "-big";
    admin_ok(pg.url(), {"conv", "create", s.small, "--kind", "group", "--members", small});
    admin_ok(pg.url(), {"conv", "create", s.big, "--kind", "group", "--members", big});
    pg.scalar("UPDATE conversations SET push_full_max = 1000000 WHERE conv_id IN ('" + s.small + "', '" + s.big +
              "') RETURNING 1");
    return s;
}

struct Result {
    Samples big, small;
    double big_cpu_ms = 0, small_cpu_ms = 0; // imserver's CPU per message (user + system)
};

// One server of `bin`: R rounds, each N messages to the small group then N
// to the big one; every message waits for all its pushes before the next.
void measure(const TestPostgres& pg, const std::string& bin, const Setup& s, int messages, int rounds, Result& out) {
    ::setenv("IMSERVER_BIN", bin.c_str(), 1);
    ServerProcess srv(pg.url(), {"--quiet"});
    WsClient sender(srv.port());
    if (str(sender.hello(s.sender.token), "t") != "welcome") throw std::runtime_error("sender hello failed");
    std::vector<std::unique_ptr<WsClient>> watchers;
    for (const auto& w : s.watchers) {
        watchers.push_back(std::make_unique<WsClient>(srv.port()));
        if (str(watchers.back()->hello(w.token), "t") != "welcome") throw std::runtime_error("watcher hello failed");
        if (str(watchers.back()->request({{"t", "sub"}}), "t") != "subscribed") throw std::runtime_error("sub failed");
    }
    std::mutex mu;
    std::condition_variable cv;
    clock_type::time_point sent_at;
    std::string current;   // the conversation of the message in flight
    int arrived = 0;       // watchers that got its push
    bool stop = false;
    Samples* into = nullptr;
    std::vector<std::thread> threads;
    for (auto& w : watchers)
        threads.emplace_back([&, c = w.get()] {
            while (true) {
                auto f = c->next_push(std::chrono::milliseconds(200));
                std::lock_guard lk(mu);
                if (stop) return;
                if (!f || str(*f, "t") != "event") continue;
                if (str(f->at("ev").as_object(), "conv") != current) continue; // a late one of a warm-up
                into->v.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - sent_at).count());
                ++arrived;
                cv.notify_all();
            }
        });
    auto one = [&](const std::string& conv, Samples& samples, const std::string& cmid) {
        {
            std::lock_guard lk(mu);
            current = conv;
            arrived = 0;
            into = &samples;
            sent_at = clock_type::now();
        }
        sender.send_json({{"t", "send"}, {"rid", cmid}, {"conv", conv}, {"cmid", cmid}, {"body", "fan-out"}});
        std::unique_lock lk(mu);
        if (!cv.wait_for(lk, std::chrono::seconds(30), [&] { return arrived == static_cast<int>(watchers.size()); }))
            throw std::runtime_error("pushes missing in " + conv);
        lk.unlock();
        auto reply = sender.next(std::chrono::seconds(30));
        if (!reply || str(*reply, "t") != "sent") throw std::runtime_error("send failed in " + conv);
    };
    const std::string tag = unique_name("m");
    Samples warm;
    one(s.small, warm, tag + "-ws"); // connections, plans, the membership caches
    one(s.big, warm, tag + "-wb");
    for (int r = 0; r < rounds; ++r)
        for (int half = 0; half < 2; ++half) {
            const bool big = half == 1;
            const double cpu0 = im::bench::cpu_seconds(srv.pid());
            for (int k = 0; k < messages; ++k)
                one(big ? s.big : s.small, big ? out.big : out.small,
                    tag + "-" + std::to_string(r) + "-" + std::to_string(half) + "-" + std::to_string(k));
            (big ? out.big_cpu_ms : out.small_cpu_ms) +=
                (im::bench::cpu_seconds(srv.pid()) - cpu0) * 1000.0 / (messages * rounds);
        }
    {
        std::lock_guard lk(mu);
        stop = true;
    }
    for (auto& t : threads) t.join();
}

void print(const char* name, Result& r, int members, int watchers) {
    std::printf("%-7s %5d-member group: push p50 %.2f ms p99 %.2f ms, imserver CPU %.2f ms/message | %d-member "
                "baseline: p50 %.2f ms p99 %.2f ms, CPU %.2f ms/message | ratios: p99 %.2fx, CPU %.2fx (%zu samples "
                "each)\n",
                name, members, r.big.pct(50), r.big.pct(99), r.big_cpu_ms, watchers + 1, r.small.pct(50),
                r.small.pct(99), r.small_cpu_ms, r.small.pct(99) > 0 ? r.big.pct(99) / r.small.pct(99) : 0.0,
                r.small_cpu_ms > 0 ? r.big_cpu_ms / r.small_cpu_ms : 0.0, r.big.v.size());
}

} // namespace

int main(int argc, char** argv) {
    int members = 5000, watchers = 50, messages = 50, rounds = 2;
    std::string before;
    for (int i = 1; i < argc; ++i) {
        auto next = [&] { return im::bench::flag_value(argc, argv, i); };
        if (!std::strcmp(argv[i], "--members")) members = std::stoi(next());
        else if (!std::strcmp(argv[i], "--watchers")) watchers = std::stoi(next());
        else if (!std::strcmp(argv[i], "--messages")) messages = std::stoi(next());
        else if (!std::strcmp(argv[i], "--rounds")) rounds = std::stoi(next());
        else if (!std::strcmp(argv[i], "--before")) before = next();
        else {
            std::fprintf(stderr, "usage: bench_fanout [--members M] [--watchers W] [--messages N] [--rounds R] "
                                 "[--before IMSERVER]\n");
            return 2;
        }
    }
    if (watchers < 1 || members < watchers + 1 || messages < 1 || rounds < 1) {
        std::fprintf(stderr, "bench_fanout: need 1 <= watchers < members, messages >= 1, rounds >= 1\n");
        return 2;
    }
    const char* env = std::getenv("IMSERVER_BIN");
    const std::string after = env && *env ? std::string(env) : exe_relative(IMSERVER_BIN_DEFAULT);
    TestPostgres pg;
    {
        ::setenv("IMSERVER_BIN", after.c_str(), 1);
        ServerProcess schema(pg.url(), {"--quiet"}); // applies the schema
    }
    const Setup s = make_setup(pg, members, watchers);
    Result now;
    measure(pg, after, s, messages, rounds, now);
    print("this", now, members, watchers);
    if (!before.empty()) {
        Result then;
        measure(pg, before, s, messages, rounds, then);
        print("before", then, members, watchers);
        std::printf("before/after: big-group p99 %.2fx\n", now.big.pct(99) > 0 ? then.big.pct(99) / now.big.pct(99) : 0.0);
    }
    return 0;
}

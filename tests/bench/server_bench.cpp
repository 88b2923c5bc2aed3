// Server send throughput against a baseline measured in the same run:
// the same number of writers doing the cheapest durable thing PostgreSQL can
// do for a message (one INSERT + COMMIT per message through libpqxx).
// Usage: server_bench [messages per writer] [writers]
#include "exe_relative.hpp"
#include "harness.hpp"

#include <pqxx/pqxx>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

using namespace im::test;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double baseline(const TestPostgres& pg, int writers, int per_writer) {
    {
        pqxx::connection c(pg.url());
        pqxx::nontransaction(c).exec("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, "
                                     "conv text, cmid text, body text)");
    }
    std::vector<std::thread> ts;
    auto t0 = clock_type::now();
    for (int w = 0; w < writers; ++w)
        ts.emplace_back([&, w] {
            pqxx::connection c(pg.url());
            for (int i = 0; i < per_writer; ++i) {
                pqxx::work tx(c);
                tx.exec_params("INSERT INTO bench_raw (conv, cmid, body) VALUES ($1, $2, $3)", "c" + std::to_string(w),
                               std::to_string(i), "benchmark body");
                tx.commit();
            }
        });
    for (auto& t : ts) t.join();
    return writers * per_writer / seconds_since(t0);
}

double through_server(const TestPostgres& pg, unsigned short port, int writers, int per_writer, bool same_conv) {
    auto w = make_world(pg.url(), "bench", writers);
    std::vector<std::string> convs;
    for (int i = 0; i < writers; ++i) {
        if (same_conv) convs.push_back(w.conv);
        else {
            convs.push_back(unique_name("benchc"));
            admin_ok(pg.url(), {"conv", "create", convs.back(), "--kind", "group", "--members", w.users[i].user});
        }
    }
    std::vector<std::unique_ptr<WsClient>> clients;
    for (int i = 0; i < writers; ++i) {
        clients.push_back(std::make_unique<WsClient>(port));
        clients.back()->hello(w.users[i].token);
    }
    std::atomic<int> failures{0};
    std::vector<std::thread> ts;
    auto t0 = clock_type::now();
    for (int i = 0; i < writers; ++i)
        ts.emplace_back([&, i] {
            for (int k = 0; k < per_writer; ++k) {
                auto r = clients[i]->request(
                    {{"t", "send"}, {"conv", convs[i]}, {"cmid", "b" + std::to_string(k)}, {"body", "benchmark body"}});
                if (str(r, "t") != "sent") ++failures;
            }
        });
    for (auto& t : ts) t.join();
    double rate = writers * per_writer / seconds_since(t0);
    if (failures) std::printf("  (%d sends failed)\n", failures.load());
    return rate;
}

// One connection that puts `count` sends on the wire before reading replies
// (an SDK flushing its outbox after a reconnect).
double pipelined(const TestPostgres& pg, unsigned short port, int count) {
    auto w = make_world(pg.url(), "pipe", 1);
    WsClient c(port);
    c.hello(w.users[0].token);
    auto t0 = clock_type::now();
    for (int k = 0; k < count; ++k)
        c.send_json({{"t", "send"}, {"rid", "p" + std::to_string(k)}, {"conv", w.conv}, {"cmid", "p" + std::to_string(k)},
                     {"body", "benchmark body"}});
    int sent = 0;
    while (sent < count) {
        auto f = c.next(30s);
        if (!f) break;
        if (str(*f, "t") == "sent") ++sent;
    }
    double rate = sent / seconds_since(t0);
    if (sent != count) std::printf("  (only %d of %d replies)\n", sent, count);
    return rate;
}

} // namespace

int main(int argc, char** argv) {
    if (!std::getenv("IMSERVER_BIN")) ::setenv("IMSERVER_BIN", im::test::exe_relative(IMSERVER_BIN_DEFAULT).c_str(), 0);
    int per_writer = argc > 1 ? std::atoi(argv[1]) : 500;
    int writers = argc > 2 ? std::atoi(argv[2]) : 4;
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet"});
    std::printf("server_bench: %d writers x %d messages, PostgreSQL fsync off (same for both)\n", writers, per_writer);
    double raw = baseline(pg, writers, per_writer);
    std::printf("  baseline raw INSERT+COMMIT (libpqxx):        %8.0f msg/s\n", raw);
    double own = through_server(pg, srv.port(), writers, per_writer, false);
    std::printf("  imserver send, one conversation per writer: %8.0f msg/s  (%.2fx of baseline)\n", own, own / raw);
    double shared = through_server(pg, srv.port(), writers, per_writer, true);
    std::printf("  imserver send, all writers in one conv:     %8.0f msg/s  (%.2fx of baseline)\n", shared, shared / raw);
    double pipe = pipelined(pg, srv.port(), writers * per_writer);
    std::printf("  imserver send, 1 connection, pipelined:     %8.0f msg/s  (%.2fx of baseline)\n", pipe, pipe / raw);
    return 0;
}

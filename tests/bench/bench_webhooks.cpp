// Webhook delivery lag (issue 52, "Done when": p99 under 1 s at 1,000
// events/s with a fast receiver). A real imserver and PostgreSQL, a real
// receiver (tests/support/webhook_receiver.hpp, answering 200 at once),
// paced senders on WebSocket connections (--rate events/s over --convs
// conversations for --seconds); the lag of an event is its arrival at the
// receiver minus its commit time (`ts`, the database's clock, same host).
// Prints p50/p99/max and whether every event arrived (ctest: bench.bench_webhooks, briefly).
#include "exe_relative.hpp"
#include "harness.hpp"
#include "webhook_receiver.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

using namespace im::test;

int main(int argc, char** argv) {
    int rate = 1000, convs = 20, seconds = 10, workers = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--rate")) rate = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--convs")) convs = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--workers")) workers = std::atoi(argv[i + 1]);
    }
    if (!std::getenv("IMSERVER_BIN")) ::setenv("IMSERVER_BIN", exe_relative(IMSERVER_BIN_DEFAULT).c_str(), 0);
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet", "--webhook-workers", std::to_string(workers)});
    WebhookReceiver rx("bench-secret-0123456789abcdef");
    std::vector<World> worlds;
    for (int c = 0; c < convs; ++c) worlds.push_back(make_world(pg.url(), "whb" + std::to_string(c), 2));
    admin_ok(pg.url(), {"webhook", "add", rx.url(), "--events", "msg", "--secret", "bench-secret-0123456789abcdef"});
    std::vector<std::unique_ptr<WsClient>> clients;
    for (auto& w : worlds) clients.push_back(login(srv.port(), w.users[0]));
    // Paced: event k at start + k / rate, round robin over the conversations.
    const long long total = static_cast<long long>(rate) * seconds;
    const auto start = std::chrono::steady_clock::now();
    for (long long k = 0; k < total; ++k) {
        std::this_thread::sleep_until(start + std::chrono::microseconds(k * 1000000 / rate));
        const auto c = static_cast<std::size_t>(k % convs);
        clients[c]->send_json({{"t", "send"}, {"conv", worlds[c].conv}, {"cmid", uuid4()}, {"body", "bench"},
                               {"rid", std::to_string(k)}});
    }
    const double send_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const bool all = wait_until([&] { return static_cast<long long>(rx.ids().size()) >= total; }, 120s);
    std::vector<long long> lags;
    std::set<std::string> seen;
    for (const auto& a : rx.accepted())
        if (seen.insert(a.id).second) lags.push_back(a.arrived_ms - a.ev.at("ts").as_int64());
    std::sort(lags.begin(), lags.end());
    auto pct = [&](double p) { return lags.empty() ? -1LL : lags[std::min(lags.size() - 1, static_cast<std::size_t>(p * lags.size()))]; };
    std::printf("webhook delivery lag: %lld events at %d/s offered (%.0f/s sent) over %d conversations, %d worker(s): "
                "p50 %lld ms, p99 %lld ms, max %lld ms; %zu arrived (%s), %d POSTs, order %s\n",
                total, rate, total / send_s, convs, workers, pct(0.5), pct(0.99), lags.empty() ? -1LL : lags.back(),
                seen.size(), all ? "all" : "NOT ALL", rx.requests(), rx.order_violation().empty() ? "ok" : "VIOLATED");
    return all && rx.order_violation().empty() ? 0 : 1;
}

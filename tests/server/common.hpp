// Shared fixture pieces for the server tests: one real PostgreSQL and one
// real imserver per test binary; every test makes its own users and
// conversations so tests never see each other's rows.
#pragma once

#include "harness.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

namespace im::test {

inline json::object send_msg(WsClient& c, const std::string& conv, const std::string& cmid, const std::string& body,
                             std::chrono::milliseconds timeout = 10s) {
    return c.request({{"t", "send"}, {"conv", conv}, {"cmid", cmid}, {"body", body}}, timeout);
}

inline json::object sync_conv(WsClient& c, const std::string& conv, std::int64_t after, std::int64_t limit = 50) {
    return c.request({{"t", "sync"}, {"conv", conv}, {"after", after}, {"limit", limit}});
}

/// Waits until the gateway's send worker has taken `runs` runs off its queue
/// (the queue stage observed): a held send then really holds a database
/// worker. "im_db_pool_in_use >= 1" is no such proof: a hello's or another
/// job's statement still ending satisfies it on a loaded machine, and the
/// next send then joins the held one's group instead of queueing behind it.
inline bool wait_send_taken(ServerProcess& srv, long long runs = 1, std::chrono::milliseconds timeout = 10s) {
    return wait_until([&] { return srv.metric("im_send_stage_seconds_count{stage=\"queue\"}") >= runs; }, timeout);
}

/// One real PostgreSQL and one real imserver shared by a test suite.
using Clock = std::chrono::steady_clock;

/// Milliseconds since `t` (for the figures the tests print).
inline long long ms_since(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

class ServerSuite : public ::testing::Test {
protected:
    static inline TestPostgres* pg = nullptr;
    static inline ServerProcess* srv = nullptr;

    static void SetUpTestSuite() {
        pg = new TestPostgres();
        srv = new ServerProcess(pg->url(), {"--quiet"});
    }
    static void TearDownTestSuite() {
        delete srv;
        delete pg;
    }
    std::string db() const { return pg->url(); }
    unsigned short port() const { return srv->port(); }
};

} // namespace im::test

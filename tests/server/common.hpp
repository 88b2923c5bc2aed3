// Shared fixture pieces for the server tests: one real PostgreSQL and one
// real imserver per test binary; every test makes its own users and
// conversations so tests never see each other's rows.
#pragma once

#include "harness.hpp"

#include <gtest/gtest.h>

#include <memory>

namespace im::test {

inline json::object send_msg(WsClient& c, const std::string& conv, const std::string& cmid, const std::string& body,
                             std::chrono::milliseconds timeout = 10s) {
    return c.request({{"t", "send"}, {"conv", conv}, {"cmid", cmid}, {"body", body}}, timeout);
}

inline json::object sync_conv(WsClient& c, const std::string& conv, std::int64_t after, std::int64_t limit = 50) {
    return c.request({{"t", "sync"}, {"conv", conv}, {"after", after}, {"limit", limit}});
}

inline std::unique_ptr<WsClient> login(unsigned short port, const TestUser& u, const std::string& install = {}) {
    auto c = std::make_unique<WsClient>(port);
    auto w = c->hello(u.token, install);
    EXPECT_EQ(str(w, "t"), "welcome") << json::serialize(w);
    return c;
}

/// Creates users named after `prefix` and a conversation holding them all.
struct World {
    std::string conv;
    std::vector<TestUser> users;
};

inline World make_world(const std::string& db, const std::string& prefix, int members, const std::string& kind = "group") {
    World w;
    w.conv = unique_name(prefix);
    std::string list;
    for (int i = 0; i < members; ++i) {
        w.users.push_back(make_user(db, unique_name(prefix + "u" + std::to_string(i))));
        list += (i ? "," : "") + w.users.back().user;
    }
    admin_ok(db, {"conv", "create", w.conv, "--kind", kind, "--members", list});
    return w;
}

inline std::string count_rows(const TestPostgres& pg, const std::string& where) {
    return pg.scalar("SELECT count(*) FROM events WHERE " + where);
}

inline std::string q(const std::string& s) { return "'" + s + "'"; }

} // namespace im::test

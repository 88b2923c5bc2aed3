// examples/backend/backend.py, run as docs/integration.md runs it, against a
// real imserver with the backend API on and a real PostgreSQL: the user,
// device and conversation it provisions and the message it posts are
// checked over a WebSocket client, signed in with the device token the API
// gave out, and (second case) with the JWT the script minted.
#include "harness.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>

using namespace im::test;

namespace {

// Runs the example; {exit status, stdout}.
std::pair<int, std::string> run_example(const std::string& api_key, const std::vector<std::string>& args) {
    std::string cmd = "IM_API_KEY='" + api_key + "' '" + std::getenv("IM_PYTHON") + "' '" +
                      std::getenv("IM_EXAMPLE_BACKEND") + "'";
    for (const auto& a : args) cmd += " '" + a + "'";
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return {-1, {}};
    std::array<char, 4096> buf{};
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    int rc = ::pclose(p);
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

std::vector<std::string> walkthrough_args(unsigned short api_port, const std::string& prefix) {
    return {"walkthrough", "--api", "http://127.0.0.1:" + std::to_string(api_port), "--user", prefix + "-dora",
            "--device", prefix + "-laptop", "--bot", prefix + "-help", "--conv", prefix + "-conv"};
}

// What a signed-in client sees: its conversation with the welcome message.
void expect_welcome_visible(WsClient& c, const std::string& conv, const std::string& bot) {
    auto page = c.request({{"t", "history"}, {"conv", conv}, {"before", 0}});
    ASSERT_EQ(str(page, "t"), "page") << json::serialize(page);
    const auto& events = page.at("events").as_array();
    ASSERT_EQ(events.size(), 3u) << json::serialize(page); // two joins, the message
    const auto& msg = events.back().as_object();
    EXPECT_EQ(str(msg, "kind"), "msg");
    EXPECT_EQ(str(msg, "sender"), bot);
    EXPECT_EQ(str(msg, "body"), "Welcome! Ask us anything here.");
}

TEST(ExamplesBackend, the_walkthrough_provisions_posts_and_the_device_token_signs_in) {
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet", "--api-listen", "127.0.0.1:0"});
    const auto key = admin_ok(pg.url(), {"apikey", "add", "example", "--scope", "write"});
    const std::string prefix = unique_name("ex");
    auto [rc, out] = run_example(key, walkthrough_args(srv.api_port(), prefix));
    ASSERT_EQ(rc, 0) << out;
    auto result = json::parse(out).as_object();
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM devices WHERE device_id = " + q(prefix + "-laptop")), "1");
    EXPECT_EQ(num(result.at("sent").as_object(), "seq"), 3);

    WsClient c(srv.port());
    auto w = c.hello(str(result, "token"));
    ASSERT_EQ(str(w, "t"), "welcome") << json::serialize(w);
    EXPECT_EQ(str(w, "user"), prefix + "-dora");
    expect_welcome_visible(c, prefix + "-conv", prefix + "-help");

    // Run again: nothing doubled, the message answers dup, a fresh token.
    auto [rc2, out2] = run_example(key, walkthrough_args(srv.api_port(), prefix));
    ASSERT_EQ(rc2, 0) << out2;
    auto again = json::parse(out2).as_object();
    EXPECT_TRUE(again.at("sent").at("dup").as_bool());
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM events WHERE conv_id = " + q(prefix + "-conv")), "3");
    EXPECT_NE(c.wait_closed(2s), -1); // the old token's connection closed with the new token
}

TEST(ExamplesBackend, the_minted_jwt_signs_in) {
    TempDir dir("exjwt");
    const std::string secret_file = dir.path() + "/secret";
    {
        std::ofstream f(secret_file);
        f << "example-secret-of-at-least-32-bytes-0123456789\n";
    }
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet", "--api-listen", "127.0.0.1:0", "--jwt-hs256-secret-file", secret_file});
    const auto key = admin_ok(pg.url(), {"apikey", "add", "example", "--scope", "write"});
    const std::string prefix = unique_name("exj");
    auto args = walkthrough_args(srv.api_port(), prefix);
    args.insert(args.end(), {"--jwt-secret-file", secret_file, "--jwt-ttl", "300"});
    auto [rc, out] = run_example(key, args);
    ASSERT_EQ(rc, 0) << out;
    auto result = json::parse(out).as_object();
    WsClient c(srv.port());
    auto w = c.hello(str(result, "jwt"));
    ASSERT_EQ(str(w, "t"), "welcome") << json::serialize(w);
    EXPECT_EQ(str(w, "user"), prefix + "-dora");
    EXPECT_EQ(str(w, "device"), prefix + "-laptop");
    expect_welcome_visible(c, prefix + "-conv", prefix + "-help");
}

} // namespace

// Robustness: at least 10,000 random and mutated frames that the server's
// request parser really judged (each answered by its own reply frame),
// against a running server; afterwards it must still answer a valid send,
// and nothing the garbage said may have created a row.
//
// Every text frame the server reads gets exactly one reply (an error for a
// bad one) unless the reply closes the connection (UNAUTHENTICATED), so the
// proof that a frame reached the parser is its reply: the test counts reply
// frames, not loop iterations. Frames are valid UTF-8 (Beast closes a
// connection on invalid UTF-8 with 1007 before our parser sees anything; that
// path has its own test below).
#include "common.hpp"

#include <random>

using namespace im::test;

namespace {

// Replaces every byte that is not part of a valid UTF-8 sequence with '?'.
std::string valid_utf8(const std::string& in) {
    std::string out;
    out.reserve(in.size());
    std::size_t i = 0;
    while (i < in.size()) {
        auto c = static_cast<unsigned char>(in[i]);
        std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        bool ok = len > 0 && i + len <= in.size();
        for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(in[i + k]) >> 6) == 0x2;
        if (ok && len == 2) ok = c >= 0xC2;                                                     // overlong
        if (ok && len == 3) {
            auto c1 = static_cast<unsigned char>(in[i + 1]);
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);                       // overlong, surrogates
        }
        if (ok && len == 4) {
            auto c1 = static_cast<unsigned char>(in[i + 1]);
            ok = c <= 0xF4 && !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
        }
        if (ok) {
            out.append(in, i, len);
            i += len;
        } else {
            out += '?';
            ++i;
        }
    }
    return out;
}

std::string mutate(std::string s, std::mt19937& rng) {
    std::uniform_int_distribution<int> op(0, 6);
    std::uniform_int_distribution<int> byte(0, 255);
    int n = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n && !s.empty(); ++i) {
        std::size_t at = rng() % s.size();
        switch (op(rng)) {
        case 0: s[at] = static_cast<char>(byte(rng)); break;
        case 1: s.erase(at, 1 + rng() % 8); break;
        case 2: s.insert(at, 1, "{}[]\":,\\0"[rng() % 9]); break;
        case 3: s = s.substr(0, at); break;
        case 4: s.insert(at, s.substr(0, std::min<std::size_t>(s.size(), 40))); break;
        case 5: s.insert(at, "\u00e9\u4e2d\U0001F600"); break;
        default: s.insert(at, std::to_string(static_cast<long long>(rng()) - (1LL << 31))); break;
        }
    }
    return valid_utf8(s);
}

TEST(Fuzz, ten_thousand_judged_bad_frames_neither_crash_nor_hang_nor_write) {
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet"});
    auto w = make_world(pg.url(), "fuzz", 2);
    const std::vector<std::string> seeds = {
        R"({"t":"hello","rid":"1","token":"x","install":"i"})",
        R"({"t":"send","rid":"2","conv":")" + w.conv + R"(","cmid":"c","body":"b"})",
        R"({"t":"sync","rid":"3","conv":")" + w.conv + R"(","after":0,"limit":5,"epoch":1})",
        R"({"t":"ack","rid":"4","conv":")" + w.conv + R"(","seq":1})",
        R"({"t":"read","rid":"6","conv":")" + w.conv + R"(","seq":1})",
        R"({"t":"recall","rid":"5","conv":")" + w.conv + R"(","target":1,"cmid":"r"})",
        R"({"t":"convs"})", R"({"t":"sub"})", R"({"t":"fetch","conv":"c","seq":1})",
    };
    std::mt19937 rng(12345);
    std::size_t judged = 0, written = 0, reconnects = 0;
    // Half the judged frames on unauthenticated connections, half after hello.
    for (int round = 0; round < 2; ++round) {
        std::unique_ptr<WsClient> c;
        auto connect = [&] {
            c = std::make_unique<WsClient>(srv.port());
            if (round == 1) {
                ASSERT_EQ(str(c->hello(w.users[0].token), "t"), "welcome");
            }
        };
        connect();
        std::size_t round_judged = 0;
        for (int batch = 0; round_judged < 5000; ++batch) {
            ASSERT_LT(batch, 20000) << "the server answered too few frames: " << round_judged;
            auto before = c->counts();
            for (int i = 0; i < 100; ++i) {
                std::string f = mutate(seeds[rng() % seeds.size()], rng);
                if (i % 50 == 0) { // pure noise now and then (valid UTF-8 noise)
                    f.resize(rng() % 200);
                    for (auto& ch : f) ch = static_cast<char>(rng() % 256);
                    f = valid_utf8(f);
                }
                c->send_text(f);
            }
            // Requests are answered in order (a frame the parser rejects at
            // once): once this request's reply is here, every frame before it
            // was answered (or the connection was closed by a failed hello).
            // Unauthenticated, convs is answered UNAUTHENTICATED in order too.
            auto r = c->request({{"t", "convs"}}, 60s);
            ASSERT_NE(str(r, "t"), "timeout") << "server hung after " << judged + round_judged << " judged frames";
            auto after = c->counts();
            std::size_t replies = after.received - before.received;
            if (!c->closed()) {
                ASSERT_EQ(round == 1 ? str(r, "t") : str(r, "code"), round == 1 ? "convs" : "UNAUTHENTICATED")
                    << json::serialize(r);
                ASSERT_GE(replies, 1u);
                replies -= 1; // the round trip's own reply
                // Nothing was lost on the way: 100 frames written, 100 answered
                // (pushes can only come after a successful sub: round 1).
                if (round == 0) EXPECT_EQ(replies, 100u);
                else EXPECT_GE(replies, 100u);
            }
            round_judged += std::min<std::size_t>(replies, 100);
            written += after.written - before.written;
            if (c->closed()) {
                ++reconnects;
                connect();
            }
        }
        judged += round_judged;
    }
    std::printf("fuzz: %zu frames judged by the parser, %zu written, %zu reconnects\n", judged, written, reconnects);
    EXPECT_GE(judged, 10000u);
    EXPECT_EQ(srv.http("GET", "/healthz").first, 200);
    auto c = login(srv.port(), w.users[0]);
    auto s = send_msg(*c, w.conv, "after-fuzz", "still alive");
    EXPECT_EQ(str(s, "t"), "sent") << json::serialize(s);
    // Only the valid send wrote a msg: garbage sent by the authenticated
    // round may have been valid JSON by chance, so count its exact key only.
    EXPECT_EQ(count_rows(pg, "conv_id = " + q(w.conv) + " AND client_msg_id = 'after-fuzz'"), "1");
    EXPECT_FALSE(srv.wait_exit(10ms).has_value()) << "server exited";
}

// Invalid UTF-8 in a text frame never reaches the parser: the connection is
// closed with 1007 and the server keeps serving others.
TEST(Fuzz, invalid_utf8_text_closes_with_1007_and_the_server_lives_on) {
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet"});
    auto w = make_world(pg.url(), "fuzz8", 2);
    for (const std::string& bad : {std::string("{\"t\":\"convs\",\"x\":\"\xff\"}"), std::string("\xc0\xaf"),
                                  std::string("\xed\xa0\x80")}) {
        WsClient c(srv.port());
        c.send_text(bad);
        EXPECT_EQ(c.wait_closed(30s), 1007);
    }
    auto c = login(srv.port(), w.users[0]);
    EXPECT_EQ(str(c->request({{"t", "convs"}}), "t"), "convs");
}

} // namespace

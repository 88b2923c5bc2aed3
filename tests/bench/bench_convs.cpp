// bench_convs: listing a user's 500 conversations (`convs`, limit 500, pages
// until has_more is false) against the real imserver and PostgreSQL, for
// one or two server binaries alternated in the same run on the same
// database (docs/benchmarks.md, "convs page"). Prints figures; not a test.
//   bench_convs [--convs N] [--events E] [--rounds R] [--requests K] [--before PATH]
// --before: another imserver binary (e.g. main's) measured alternately with
// this build's; both must answer the same pages, or the run fails.
#include "exe_relative.hpp"
#include "harness.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace im::test;
using clock_type = std::chrono::steady_clock;

namespace {

// N group conversations of ana and ben with E msgs each (ana sends every
// third), ana's read marker halfway; every fifth conversation ana left at
// seq 10 and rejoined at 15 (two periods), every seventh has a recall of
// one of ben's last msgs (above the read marker): the unread rule's every
// branch. Written with SQL (the admin CLI would take a process per
// conversation).
void seed(const TestPostgres& pg, int convs, int events) {
    pqxx::connection c(pg.url());
    pqxx::work tx(c);
    tx.exec_params(
        "INSERT INTO conversations (conv_id, kind, next_seq) "
        "SELECT 'bc-' || lpad(i::text, 5, '0'), 'group', $2::bigint + 3 FROM generate_series(1, $1) i",
        convs, events);
    // seq 1, 2: the joins; 3 .. events + 2: msgs, except the leave/rejoin
    // of every fifth conversation; a recall of ben's msg at seq events + 1
    // at the end of every seventh (its next_seq is one more).
    tx.exec_params(
        "WITH raw AS ("
        " SELECT 'bc-' || lpad(i::text, 5, '0') AS conv, i, s AS seq, "
        "   CASE WHEN s = 1 OR (i % 5 = 0 AND s = 15) THEN 'join' WHEN s = 2 THEN 'join' "
        "        WHEN i % 5 = 0 AND s = 10 THEN 'leave' ELSE 'msg' END AS kind, "
        "   CASE WHEN s = 2 THEN 'ben' WHEN s = 1 OR (i % 5 = 0 AND s IN (10, 15)) THEN 'ana' END AS subject, "
        "   CASE WHEN s % 3 = 0 AND NOT (i % 5 = 0 AND s BETWEEN 10 AND 15) THEN 'ana' ELSE 'ben' END AS who "
        " FROM generate_series(1, $1) i, generate_series(1, $2::bigint + 2) s) "
        "INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, body, subject_user, epoch, "
        "  msg_ordinal, sender_ordinal) "
        "SELECT conv, seq, kind, CASE WHEN kind = 'msg' THEN who END, "
        "  CASE WHEN kind = 'msg' THEN 'm' || seq END, CASE WHEN kind = 'msg' THEN 'body ' || seq END, subject, 1, "
        "  sum((kind = 'msg')::int) OVER (PARTITION BY conv ORDER BY seq), "
        "  CASE WHEN kind = 'msg' THEN sum((kind = 'msg')::int) OVER (PARTITION BY conv, (kind = 'msg'), who "
        "    ORDER BY seq) END "
        "FROM raw",
        convs, events);
    tx.exec("UPDATE conversations c SET msg_count = (SELECT count(*) FROM events e "
            "WHERE e.conv_id = c.conv_id AND e.kind = 'msg') WHERE conv_id LIKE 'bc-%'");
    tx.exec_params("INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, target_seq, epoch, "
                   "  msg_ordinal) "
                   "SELECT conv_id, next_seq, 'recall', 'ben', 'r', $1, 1, msg_count FROM conversations "
                   "WHERE conv_id LIKE 'bc-%' AND right(conv_id, 5)::int % 7 = 0",
                   (events + 1) % 3 ? events + 1 : events + 2); // ben's, not ana's (seq % 3 == 0)
    tx.exec("UPDATE conversations SET next_seq = next_seq + 1 WHERE conv_id LIKE 'bc-%' "
            "AND right(conv_id, 5)::int % 7 = 0");
    tx.exec("INSERT INTO membership_periods (conv_id, user_id, from_seq, to_seq) "
            "SELECT conv_id, 'ana', 1, CASE WHEN right(conv_id, 5)::int % 5 = 0 THEN 10 END FROM conversations "
            "WHERE conv_id LIKE 'bc-%' UNION ALL "
            "SELECT conv_id, 'ana', 15, NULL FROM conversations "
            "WHERE conv_id LIKE 'bc-%' AND right(conv_id, 5)::int % 5 = 0 UNION ALL "
            "SELECT conv_id, 'ben', 2, NULL FROM conversations WHERE conv_id LIKE 'bc-%'");
    tx.exec_params("INSERT INTO read_markers (conv_id, user_id, read) "
                   "SELECT conv_id, 'ana', $1 FROM conversations WHERE conv_id LIKE 'bc-%'",
                   events / 2);
    tx.commit();
    pqxx::nontransaction(c).exec("ANALYZE");
}

struct Listing {
    std::vector<std::string> pages; // the replies without rid, serialised
    int convs = 0;
};

Listing list_all(WsClient& c) {
    Listing l;
    std::string after;
    for (;;) {
        auto r = c.request({{"t", "convs"}, {"after", after}, {"limit", 500}}, 60s);
        if (str(r, "t") != "convs") throw std::runtime_error("convs failed: " + json::serialize(r));
        r.erase("rid");
        l.convs += static_cast<int>(r.at("convs").as_array().size());
        l.pages.push_back(json::serialize(r));
        if (!r.at("has_more").as_bool()) return l;
        after = str(r, "next_after");
    }
}

struct Sample {
    std::vector<double> ms; // per full listing
    Listing answer;
};

// One server of `bin` on the database: K timed listings after one warm-up.
void measure(const TestPostgres& pg, const std::string& bin, const std::string& token, int requests, Sample& out) {
    ::setenv("IMSERVER_BIN", bin.c_str(), 1);
    ServerProcess srv(pg.url(), {"--quiet"});
    auto ws = login(srv.port(), token);
    WsClient& c = *ws;
    out.answer = list_all(c); // warm-up: connections, plans, caches
    for (int k = 0; k < requests; ++k) {
        auto t0 = clock_type::now();
        auto l = list_all(c);
        out.ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
        if (l.pages != out.answer.pages) throw std::runtime_error("the same server answered two listings differently");
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
    int convs = 500, events = 40, rounds = 3, requests = 5;
    std::string before;
    for (int i = 1; i < argc; ++i) {
        auto next = [&]() -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", argv[i]);
                std::exit(2);
            }
            return argv[++i];
        };
        if (!std::strcmp(argv[i], "--convs")) convs = std::atoi(next());
        else if (!std::strcmp(argv[i], "--events")) events = std::atoi(next());
        else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(next());
        else if (!std::strcmp(argv[i], "--requests")) requests = std::atoi(next());
        else if (!std::strcmp(argv[i], "--before")) before = next();
        else {
            std::fprintf(stderr, "usage: bench_convs [--convs N] [--events E] [--rounds R] [--requests K] "
                                 "[--before IMSERVER]\n");
            return 2;
        }
    }
    if (events < 20) events = 20; // the leave/rejoin and the recall need seqs up to 15
    const char* env = std::getenv("IMSERVER_BIN");
    const std::string after = env && *env ? std::string(env) : im::test::exe_relative(IMSERVER_BIN_DEFAULT);
    ::setenv("IMSERVER_BIN", after.c_str(), 1);
    TestPostgres pg;
    std::string token;
    {
        ServerProcess schema(pg.url(), {"--quiet"}); // applies the schema
        admin_ok(pg.url(), {"user", "add", "ana"});
        admin_ok(pg.url(), {"user", "add", "ben"});
        token = admin_ok(pg.url(), {"device", "add", "ana", "ana-phone"});
    }
    seed(pg, convs, events);

    struct Bin { const char* name; std::string path; std::vector<double> ms; Listing answer; };
    std::vector<Bin> bins;
    if (!before.empty()) bins.push_back({"before", before, {}, {}});
    bins.push_back({"after", after, {}, {}});
    for (int r = 0; r < rounds; ++r)
        for (auto& b : bins) {
            Sample s;
            measure(pg, b.path, token, requests, s);
            b.ms.insert(b.ms.end(), s.ms.begin(), s.ms.end());
            if (b.answer.pages.empty()) b.answer = s.answer;
            std::printf("round %d %-6s median %8.1f ms per listing of %d conversations (%zu pages)\n", r + 1, b.name,
                        median(s.ms), s.answer.convs, s.answer.pages.size());
            std::fflush(stdout);
        }
    std::printf("\n%d conversations (%d events each), %d rounds x %d listings per server, alternated\n", convs,
                events + 2, rounds, requests);
    for (auto& b : bins)
        std::printf("%-6s median %8.1f ms  min %8.1f ms  max %8.1f ms\n", b.name, median(b.ms),
                    *std::min_element(b.ms.begin(), b.ms.end()), *std::max_element(b.ms.begin(), b.ms.end()));
    if (bins.size() == 2) {
        const bool same = bins[0].answer.pages == bins[1].answer.pages;
        std::printf("before/after: %.1fx faster; same answers: %s\n", median(bins[0].ms) / median(bins[1].ms),
                    same ? "yes" : "NO");
        if (!same) {
            for (std::size_t p = 0; p < std::min(bins[0].answer.pages.size(), bins[1].answer.pages.size()); ++p)
                if (bins[0].answer.pages[p] != bins[1].answer.pages[p])
                    std::fprintf(stderr, "page %zu differs:\nbefore %s\nafter  %s\n", p,
                                 bins[0].answer.pages[p].substr(0, 2000).c_str(),
                                 bins[1].answer.pages[p].substr(0, 2000).c_str());
            return 1;
        }
    }
    return 0;
}

// bench_attachments: the attachment targets of issue 50 (docs/benchmarks.md,
// "Attachments"), on a real imserver and PostgreSQL over loopback, each
// store in turn (chunks in PostgreSQL, then --attachments-dir). Prints
// figures and ratios measured in the same run; never asserts a time.
//   bench_attachments [--mib N] [--uploads K] [--senders S] [--seconds T]
//                     [--rounds R] [--starvation-only] [--store pg|dir] [--server-flag F]...
//   bench_attachments --before IMSERVER [--rounds R] [--mib N]
// IM_BENCH_ATTACHMENT_MIB overrides --mib (the figure is 100; the
// ctest run keeps it small). --before: throughput only, that binary and
// the one under test (IMSERVER_BIN) alternated R rounds, then medians.
//
// 1. Throughput: one N MiB file PUT in 8 MiB requests on one connection,
//    then GET whole, against the baseline of a plain file copy of the same
//    bytes in the same run (write + fdatasync per 1 MiB piece, the durable
//    write the server does; read back from the page cache for the download).
//    The client reads the body as curl does (socket straight into its
//    buffer). Beside the ratios: the CPU seconds of the gateway, PostgreSQL
//    and the client per transfer (the work, which load changes little).
// 2. Server memory: the gateway's VmHWM (peak RSS) growth over the
//    transfers, in 1 MiB pieces (the target: under 3 per transfer).
// 3. Resume after a kill: the connection reset at 40 % of a PUT; what the
//    client re-sends from GET /v1/uploads/{id}'s offset (target: <= 1 piece).
// 4. Starvation: S senders send text as fast as acks come for T seconds,
//    alone, then while K concurrent 1 MiB uploads run in a loop; text ack
//    p99 with uploads / without (target <= 1.5). --rounds R alternates the
//    two windows R times (medians printed); each window also prints the
//    server's own send times by stage (/metrics) and the CPU of the
//    gateway, PostgreSQL and this process. --starvation-only skips 1-3.
#include "bench_support.hpp"
#include "exe_relative.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <openssl/sha.h>

#include <atomic>
#include <cctype>
#include <map>
#include <sstream>
#include <tuple>
#include <cstring>
#include <fcntl.h>

using namespace im::test;
using im::bench::Samples;
using clock_type = std::chrono::steady_clock;

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

constexpr std::size_t piece = 1u << 20;

std::string sha256_hex(const std::string& data) {
    unsigned char d[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), d);
    std::string out;
    for (unsigned char b : d) {
        out += "0123456789abcdef"[b >> 4];
        out += "0123456789abcdef"[b & 15];
    }
    return out;
}

double secs_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

long vm_kib(pid_t pid, const char* field) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + std::strlen(field) + 1);
    return -1;
}

// HTTP/1.1 on one keep-alive connection.
struct Http {
    net::io_context ioc;
    beast::tcp_stream s{ioc};
    beast::flat_buffer buf;
    std::string token;
    Http(unsigned short port, std::string t) : token(std::move(t)) {
        s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    }
    std::pair<int, std::string> call(http::verb m, const std::string& target, std::string body = {}) {
        s.expires_after(std::chrono::seconds(300));
        http::request<http::string_body> req{m, target, 11};
        req.set(http::field::host, "127.0.0.1");
        req.set(http::field::authorization, "Bearer " + token);
        req.body() = std::move(body);
        if (m != http::verb::get) req.prepare_payload();
        http::write(s, req);
        http::response_parser<http::string_body> p;
        p.body_limit(std::uint64_t(4) << 30);
        http::read(s, buf, p);
        return {static_cast<int>(p.get().result_int()), std::move(p.get().body())};
    }
    // A GET whose body is read as curl reads one: the header parsed, then
    // the socket read straight into the buffer that keeps the bytes (no
    // parser copy in between; Beast's string_body resizes and copies
    // every 64 KiB receive, which cost this client more CPU than the
    // gateway spent sending: the download's measure was the client's).
    std::pair<int, std::string> download(const std::string& target) {
        s.expires_after(std::chrono::seconds(300));
        http::request<http::empty_body> req{http::verb::get, target, 11};
        req.set(http::field::host, "127.0.0.1");
        req.set(http::field::authorization, "Bearer " + token);
        http::write(s, req);
        http::response_parser<http::empty_body> p;
        p.body_limit(std::uint64_t(4) << 30);
        http::read_header(s, buf, p);
        const int status = static_cast<int>(p.get().result_int());
        if (!p.content_length()) throw std::runtime_error("download without Content-Length");
        std::string body(static_cast<std::size_t>(*p.content_length()), '\0');
        const std::size_t have = std::min(buf.size(), body.size());
        net::buffer_copy(net::buffer(body.data(), have), buf.data());
        buf.consume(have);
        net::read(s.socket(), net::buffer(body.data() + have, body.size() - have));
        return {status, std::move(body)};
    }
};

std::string start(Http& h, const std::string& data) {
    auto [st, body] = h.call(http::verb::post, "/v1/uploads",
                             json::serialize(json::object{{"name", "bench.bin"}, {"mime", "application/octet-stream"},
                                                          {"size", static_cast<std::int64_t>(data.size())},
                                                          {"sha256", sha256_hex(data)}}));
    if (st != 201) throw std::runtime_error("POST /v1/uploads: " + std::to_string(st) + " " + body);
    return str(json::parse(body).as_object(), "att_id");
}

void put_all(Http& h, const std::string& att, const std::string& data, std::size_t from = 0) {
    const std::size_t step = 8u << 20;
    for (std::size_t at = from; at < data.size(); at += step) {
        auto [st, body] = h.call(http::verb::put, "/v1/uploads/" + att + "?offset=" + std::to_string(at),
                                 data.substr(at, step));
        if (st != 200) throw std::runtime_error("PUT: " + std::to_string(st) + " " + body);
    }
}

// The baseline: the same bytes written durably piece by piece, then read.
std::pair<double, double> file_copy(const std::string& dir, const std::string& data) {
    const std::string path = dir + "/baseline.bin";
    auto t0 = clock_type::now();
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    for (std::size_t at = 0; at < data.size(); at += piece) {
        const std::size_t n = std::min(piece, data.size() - at);
        if (::pwrite(fd, data.data() + at, n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) break;
        ::fdatasync(fd);
    }
    ::fsync(fd);
    ::close(fd);
    const double write_s = secs_since(t0);
    t0 = clock_type::now();
    std::string back(data.size(), '\0');
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    std::size_t got = 0;
    while (got < back.size()) {
        auto n = ::pread(fd, back.data() + got, std::min(piece, back.size() - got), static_cast<off_t>(got));
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
    }
    ::close(fd);
    const double read_s = secs_since(t0);
    std::filesystem::remove(path);
    return {write_s, read_s};
}

// The file of the throughput phase: `mib` MiB of xorshift bytes (they do
// not compress, as a user's photos and archives do not).
std::string bench_bytes(std::size_t mib) {
    std::string data(mib * piece, '\0');
    std::uint64_t x = 88172645463325252ull;
    for (std::size_t i = 0; i + 8 <= data.size(); i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        std::memcpy(&data[i], &x, 8);
    }
    return data;
}

// One throughput round: the file copy, then the upload and the download
// through the server, and the gateway's peak RSS growth.
struct Throughput {
    double copy_w = 0, copy_r = 0, up_s = 0, down_s = 0; // seconds
    long rss0 = 0, hwm = 0;                               // KiB
    // CPU seconds each transfer cost the gateway, PostgreSQL (postmaster
    // and backends) and this client: the work, which the load of a shared
    // machine changes far less than the wall-clock time.
    double up_gw = 0, up_pg = 0, up_cl = 0, down_gw = 0, down_pg = 0, down_cl = 0;
    double up_ratio() const { return copy_w / up_s; }
    double down_ratio() const { return copy_r / down_s; }
    double rss_pieces() const { return static_cast<double>(hwm - rss0) / 1024.0 / 2.0; }
};

Throughput measure_throughput(pid_t server, pid_t postmaster, unsigned short port, const std::string& token,
                              const std::string& tmp, const std::string& data) {
    Throughput r;
    std::tie(r.copy_w, r.copy_r) = file_copy(tmp, data);
    r.rss0 = vm_kib(server, "VmRSS:");
    Http h(port, token);
    const std::string att = start(h, data);
    double gw0 = im::bench::cpu_seconds(server), pg0 = im::bench::postgres_cpu(postmaster), cl0 = im::bench::self_cpu();
    auto t0 = clock_type::now();
    put_all(h, att, data);
    r.up_s = secs_since(t0);
    double gw1 = im::bench::cpu_seconds(server), pg1 = im::bench::postgres_cpu(postmaster), cl1 = im::bench::self_cpu();
    r.up_gw = gw1 - gw0, r.up_pg = pg1 - pg0, r.up_cl = cl1 - cl0;
    t0 = clock_type::now();
    auto [gst, got] = h.download("/v1/attachments/" + att);
    r.down_s = secs_since(t0);
    r.down_gw = im::bench::cpu_seconds(server) - gw1;
    r.down_pg = im::bench::postgres_cpu(postmaster) - pg1;
    r.down_cl = im::bench::self_cpu() - cl1;
    if (gst != 200 || got != data) throw std::runtime_error("download differs: " + std::to_string(gst));
    r.hwm = vm_kib(server, "VmHWM:");
    return r;
}

void print_throughput(const Throughput& r, std::size_t mib) {
    const double mibf = static_cast<double>(mib);
    std::printf("  %zu MiB upload   %7.1f MiB/s   baseline file write+fdatasync per MiB %7.1f MiB/s   ratio %.2f\n",
                mib, mibf / r.up_s, mibf / r.copy_w, r.up_ratio());
    std::printf("  %zu MiB download %7.1f MiB/s   baseline file read                    %7.1f MiB/s   ratio %.2f\n",
                mib, mibf / r.down_s, mibf / r.copy_r, r.down_ratio());
    std::printf("  CPU s: upload gateway %.2f postgres %.2f client %.2f; download gateway %.2f postgres %.2f client %.2f\n",
                r.up_gw, r.up_pg, r.up_cl, r.down_gw, r.down_pg, r.down_cl);
    std::printf("  server RSS %ld KiB before, peak %ld KiB after 2 transfers: growth %.2f MiB = %.2f pieces per transfer\n",
                r.rss0, r.hwm, static_cast<double>(r.hwm - r.rss0) / 1024.0, r.rss_pieces());
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// --before PATH --rounds R: throughput only, the "before" binary (PATH) and
// the one under test alternated, store by store, round by round, each on a
// fresh gateway; then the medians of each (the machine is shared: ratios of
// one round are noise, alternation spreads the load over both).
void alternate(const TestPostgres& pg, const std::string& tmp, std::size_t mib, int rounds, const std::string& before,
               const std::string& after) {
    struct Series { std::vector<double> up, down, rss, up_mib, down_mib, up_gw, up_pg, down_gw, down_pg; };
    const pid_t postmaster = im::bench::postmaster_pid(pg.url());
    std::map<std::string, Series> series; // "<store> <binary>"
    const auto data = bench_bytes(mib);
    const double mibf = static_cast<double>(mib);
    for (int round = 1; round <= rounds; ++round) {
        for (const std::string store : {"pg", "dir"}) {
            // Which goes first changes each round: the second of a pair
            // would otherwise always run beside the first one's checkpoint.
            std::vector<std::pair<std::string, std::string>> order{{"before", before}, {"after", after}};
            if (round % 2 == 0) std::swap(order[0], order[1]);
            for (const auto& [which, bin] : order) {
                ::setenv("IMSERVER_BIN", bin.c_str(), 1);
                // Each measurement starts from the same state: no earlier
                // round's chunks in the table, no dirty pages to flush.
                pg.scalar("DO $$ BEGIN IF to_regclass('upload_chunks') IS NOT NULL THEN TRUNCATE upload_chunks; "
                          "END IF; END $$");
                pg.scalar("CHECKPOINT");
                std::vector<std::string> flags{"--quiet"};
                if (store == "dir") {
                    std::filesystem::remove_all(tmp + "/store");
                    flags.insert(flags.end(), {"--attachments-dir", tmp + "/store"});
                }
                ServerProcess srv(pg.url(), flags, "gw-" + store + which);
                auto w = make_world(pg.url(), "balt" + store + which + std::to_string(round), 1);
                const auto r = measure_throughput(srv.pid(), postmaster, srv.port(), w.users[0].token, tmp, data);
                std::printf("round %d %-3s %-6s upload %6.1f MiB/s ratio %.2f  download %6.1f MiB/s ratio %.2f  RSS %.2f pieces"
                            "  CPU s up gw %.2f pg %.2f down gw %.2f pg %.2f\n",
                            round, store.c_str(), which.c_str(), mibf / r.up_s, r.up_ratio(), mibf / r.down_s,
                            r.down_ratio(), r.rss_pieces(), r.up_gw, r.up_pg, r.down_gw, r.down_pg);
                std::fflush(stdout);
                auto& s = series[store + " " + which];
                s.up.push_back(r.up_ratio());
                s.down.push_back(r.down_ratio());
                s.rss.push_back(r.rss_pieces());
                s.up_mib.push_back(mibf / r.up_s);
                s.down_mib.push_back(mibf / r.down_s);
                s.up_gw.push_back(r.up_gw);
                s.up_pg.push_back(r.up_pg);
                s.down_gw.push_back(r.down_gw);
                s.down_pg.push_back(r.down_pg);
            }
        }
    }
    std::printf("\nmedians of %d rounds (ratio: server / file copy in the same round):\n", rounds);
    for (auto& [k, s] : series)
        std::printf("  %-10s upload %6.1f MiB/s ratio %.2f   download %6.1f MiB/s ratio %.2f   RSS %.2f pieces   "
                    "CPU s up gw %.2f pg %.2f down gw %.2f pg %.2f\n",
                    k.c_str(), median(s.up_mib), median(s.up), median(s.down_mib), median(s.down), median(s.rss),
                    median(s.up_gw), median(s.up_pg), median(s.down_gw), median(s.down_pg));
}

// One text sender: send after send for `seconds`, each ack's latency.
void text_sender(unsigned short port, const TestUser& u, const std::string& conv, double seconds, Samples& out,
                 std::atomic<bool>& failed) {
    try {
        auto c = login(port, u);
        const auto end = clock_type::now() + std::chrono::duration<double>(seconds);
        int n = 0;
        while (clock_type::now() < end) {
            auto t0 = clock_type::now();
            auto r = c->request({{"t", "send"}, {"conv", conv}, {"cmid", unique_name("b") + std::to_string(n++)},
                                 {"body", "a line of text while files go by"}},
                                30s);
            if (str(r, "t") != "sent") throw std::runtime_error("send: " + json::serialize(r));
            out.v.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "sender: %s\n", e.what());
        failed = true;
    }
}

double p99_of_senders(unsigned short port, const World& w, int senders, double seconds, std::atomic<bool>& failed) {
    std::vector<Samples> per(static_cast<std::size_t>(senders));
    std::vector<std::thread> ts;
    for (int i = 0; i < senders; ++i)
        ts.emplace_back(text_sender, port, std::cref(w.users[static_cast<std::size_t>(i)]), std::cref(w.conv), seconds,
                        std::ref(per[static_cast<std::size_t>(i)]), std::ref(failed));
    for (auto& t : ts) t.join();
    Samples all;
    for (auto& s : per) all.v.insert(all.v.end(), s.v.begin(), s.v.end());
    std::printf("    %zu acks, p50 %.2f ms, p99 %.2f ms\n", all.v.size(), all.pct(50), all.pct(99));
    return all.pct(99);
}

// The send path's own view of a window: /metrics' send histograms (server
// side: request read -> reply written, and its stages) and the CPU seconds
// of the gateway, of PostgreSQL and of this bench process.
struct ServerView {
    std::map<std::string, double> m;
    double gw_cpu = 0, pg_cpu = 0, bench_cpu = 0;
    // CPU seconds by gateway thread name ("im-io-1" -> "im-io") and by
    // PostgreSQL application_name ("imserver-pool-2" -> "imserver-pool";
    // the cluster's own processes "postgres").
    std::map<std::string, double> threads, backends;
    clock_type::time_point at;
    static ServerView take(const ServerProcess& srv, const TestPostgres& pg, pid_t postmaster) {
        ServerView v;
        auto [st, body] = srv.http("GET", "/metrics");
        if (st == 200) {
            std::istringstream in(body);
            for (std::string line; std::getline(in, line);) {
                if (line.rfind("im_send_", 0) != 0 || line.find("_bucket") != std::string::npos) continue;
                const auto sp = line.rfind(' ');
                if (sp != std::string::npos) v.m[line.substr(0, sp)] = std::atof(line.c_str() + sp + 1);
            }
        }
        v.gw_cpu = im::bench::cpu_seconds(srv.pid());
        v.pg_cpu = im::bench::postgres_cpu(postmaster);
        auto group = [](std::string n) {
            while (!n.empty() && (std::isdigit(static_cast<unsigned char>(n.back())) || n.back() == '-')) n.pop_back();
            return n;
        };
        const std::string task = "/proc/" + std::to_string(srv.pid()) + "/task";
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator(task, ec)) {
            std::ifstream comm(e.path() / "comm");
            std::string name;
            std::getline(comm, name);
            // The task's own stat (/proc/TID/stat would be the process's).
            std::ifstream st(e.path() / "stat");
            std::string line((std::istreambuf_iterator<char>(st)), {});
            const auto close = line.rfind(')');
            if (close == std::string::npos) continue;
            std::istringstream in(line.substr(close + 2));
            std::vector<std::string> f;
            for (std::string x; in >> x;) f.push_back(x);
            if (f.size() < 13) continue;
            v.threads[group(name)] += (std::atof(f[11].c_str()) + std::atof(f[12].c_str())) /
                                      static_cast<double>(::sysconf(_SC_CLK_TCK));
        }
        try {
            pqxx::connection c(pg.url());
            pqxx::nontransaction tx(c);
            std::map<pid_t, std::string> app;
            for (const auto& row : tx.exec("SELECT pid, application_name FROM pg_stat_activity"))
                app[row[0].as<int>()] = row[1].is_null() ? std::string() : row[1].c_str();
            for (const auto& e : std::filesystem::directory_iterator("/proc")) {
                const pid_t p = std::atoi(e.path().filename().c_str());
                if (p <= 0 || (p != postmaster && im::bench::parent_of(p) != postmaster)) continue;
                auto it = app.find(p);
                const std::string name = it == app.end() || it->second.empty() ? "postgres" : group(it->second);
                v.backends[name] += im::bench::cpu_seconds(p);
            }
        } catch (const std::exception&) {
        }
        v.bench_cpu = im::bench::self_cpu();
        v.at = clock_type::now();
        return v;
    }
};

// Mean milliseconds of one histogram between two views.
double mean_ms(const ServerView& a, const ServerView& b, const std::string& name, const std::string& labels = {}) {
    auto get = [&](const ServerView& v, const std::string& k) {
        auto it = v.m.find(k);
        return it == v.m.end() ? 0.0 : it->second;
    };
    const double n = get(b, name + "_count" + labels) - get(a, name + "_count" + labels);
    const double s = get(b, name + "_sum" + labels) - get(a, name + "_sum" + labels);
    return n > 0 ? s / n * 1000.0 : 0.0;
}

void print_view(const ServerView& a, const ServerView& b) {
    const double wall = std::chrono::duration<double>(b.at - a.at).count();
    auto stage = [&](const char* k) { return mean_ms(a, b, "im_send_stage_seconds", std::string("{stage=\"") + k + "\"}"); };
    std::printf("      server side, mean ms: send %.2f (queue %.2f, statement %.2f, publish %.2f, strand %.2f); "
                "CPU s/s: gateway %.2f, postgres %.2f, bench %.2f\n",
                mean_ms(a, b, "im_send_seconds"), stage("queue"), stage("statement"), stage("publish"), stage("strand"),
                (b.gw_cpu - a.gw_cpu) / wall, (b.pg_cpu - a.pg_cpu) / wall, (b.bench_cpu - a.bench_cpu) / wall);
    auto by = [&](const char* what, const std::map<std::string, double>& x, const std::map<std::string, double>& y) {
        std::printf("      %s CPU s/s:", what);
        for (const auto& [k, v] : y) {
            auto it = x.find(k);
            const double d = (v - (it == x.end() ? 0.0 : it->second)) / wall;
            if (d >= 0.005) std::printf(" %s %.2f", k.c_str(), d);
        }
        std::printf("\n");
    };
    by("gateway threads", a.threads, b.threads);
    by("postgres by application_name", a.backends, b.backends);
}

// 4. Starvation, `rounds` times in turn: the senders alone, then the
// senders while `uploads` clients PUT 1 MiB files in a loop. Each round's
// ratio, then the medians.
void starvation(const ServerProcess& srv, const TestPostgres& pg, const World& w, int uploads, int senders,
                double seconds, int rounds) {
    const auto port = srv.port();
    const auto& u = w.users[0];
    const pid_t postmaster = im::bench::postmaster_pid(pg.url());
    // One file's bytes and digest for every upload: the client's hashing is
    // not the server's load.
    const std::string one(piece, 'f');
    const std::string one_sha = sha256_hex(one);
    std::vector<double> ratios, alones, busies;
    long total_uploads = 0;
    for (int r = 0; r < rounds; ++r) {
        std::atomic<bool> failed{false};
        std::printf("  round %d: %d text senders alone, %.1f s:\n", r + 1, senders, seconds);
        auto v0 = ServerView::take(srv, pg, postmaster);
        const double alone = p99_of_senders(port, w, senders, seconds, failed);
        auto v1 = ServerView::take(srv, pg, postmaster);
        print_view(v0, v1);
        std::atomic<bool> stop{false};
        std::atomic<long> done_uploads{0};
        std::atomic<int> started{0};
        std::vector<std::thread> up;
        for (int i = 0; i < uploads; ++i)
            up.emplace_back([&] {
                try {
                    Http c(port, u.token);
                    ++started;
                    while (!stop) {
                        auto [st, body] = c.call(http::verb::post, "/v1/uploads",
                                                 json::serialize(json::object{{"name", "bench.bin"},
                                                                              {"mime", "application/octet-stream"},
                                                                              {"size", static_cast<std::int64_t>(piece)},
                                                                              {"sha256", one_sha}}));
                        if (st != 201) throw std::runtime_error("POST /v1/uploads: " + std::to_string(st) + " " + body);
                        put_all(c, str(json::parse(body).as_object(), "att_id"), one);
                        ++done_uploads;
                    }
                } catch (const std::exception& e) {
                    std::fprintf(stderr, "uploader: %s\n", e.what());
                    failed = true;
                }
            });
        // The window starts once every uploader is connected and the first
        // uploads are under way.
        im::bench::wait_until([&] { return started.load() == uploads; }, 60s, "the uploaders connected");
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const long before = done_uploads.load();
        std::printf("  round %d: %d text senders while %d uploaders PUT 1 MiB files in a loop:\n", r + 1, senders,
                    uploads);
        auto v2 = ServerView::take(srv, pg, postmaster);
        const double busy = p99_of_senders(port, w, senders, seconds, failed);
        auto v3 = ServerView::take(srv, pg, postmaster);
        const long during = done_uploads.load() - before;
        stop = true;
        for (auto& t : up) t.join();
        print_view(v2, v3);
        const double ratio = alone > 0 ? busy / alone : 0.0;
        std::printf("  round %d: %ld uploads of 1 MiB in the window (%.1f MiB/s); text ack p99 with uploads / "
                    "without: %.1f / %.1f ms = %.2f%s\n",
                    r + 1, during, static_cast<double>(during) / seconds, busy, alone, ratio,
                    failed ? " (a sender or uploader failed)" : "");
        ratios.push_back(ratio);
        alones.push_back(alone);
        busies.push_back(busy);
        total_uploads += during;
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    std::printf("  starvation, median of %d rounds: text ack p99 %.1f ms with uploads / %.1f ms without; ratio %.2f "
                "(target <= 1.5)\n",
                rounds, median(busies), median(alones), median(ratios));
}

void run_store(const TestPostgres& pg, const std::string& label, std::vector<std::string> flags,
               const std::string& tmp, std::size_t mib, int uploads, int senders, double seconds, int rounds,
               bool starvation_only) {
    std::printf("\n== store: %s\n", label.c_str());
    ServerProcess srv(pg.url(), flags, "gw-" + label);
    const auto port = srv.port();
    auto w = make_world(pg.url(), "batt" + label, std::max(senders, 1));
    const auto& u = w.users[0];
    if (starvation_only) {
        if (senders > 0 && uploads > 0) starvation(srv, pg, w, uploads, senders, seconds, rounds);
        return;
    }

    // 1. throughput and memory
    const std::string data = bench_bytes(mib);
    const auto tp = measure_throughput(srv.pid(), im::bench::postmaster_pid(pg.url()), port, u.token, tmp, data);
    print_throughput(tp, mib);
    Http h(port, u.token);

    // 3. resume after a kill at 40 %
    {
        const std::string att2 = start(h, data);
        // One PUT carries at most 8 MiB: the killed request declares that much.
        const std::size_t declared = std::min<std::size_t>(data.size(), 8u << 20);
        const std::size_t sent = declared * 4 / 10;
        {
            net::io_context ioc;
            tcp::socket s(ioc);
            s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
            const std::string head = "PUT /v1/uploads/" + att2 + "?offset=0 HTTP/1.1\r\nHost: b\r\nAuthorization: Bearer " +
                                     u.token + "\r\nContent-Length: " + std::to_string(declared) + "\r\n\r\n";
            net::write(s, net::buffer(head));
            net::write(s, net::buffer(data.data(), sent));
            const std::string whole = std::to_string(sent / piece * piece);
            im::bench::wait_until(
                [&] { return pg.scalar("SELECT received FROM uploads WHERE att_id = '" + att2 + "'") == whole; }, 60s,
                "the pieces sent before the kill committed");
            s.set_option(net::socket_base::linger(true, 0));
            s.close();
        }
        auto [st, body] = h.call(http::verb::get, "/v1/uploads/" + att2);
        if (st != 200) throw std::runtime_error("GET /v1/uploads: " + body);
        const auto offset = static_cast<std::size_t>(json::parse(body).as_object().at("offset").as_int64());
        put_all(h, att2, data, offset);
        std::printf("  resume: killed after %zu bytes sent, the server stood at %zu: re-sent %zu bytes = %.2f pieces\n",
                    sent, offset, sent - offset, static_cast<double>(sent - offset) / static_cast<double>(piece));
    }

    // 4. starvation
    if (senders > 0 && uploads > 0) starvation(srv, pg, w, uploads, senders, seconds, rounds);
}

} // namespace

int main(int argc, char** argv) {
    std::size_t mib = 100;
    int uploads = 100, senders = 16;
    double seconds = 5;
    int rounds = 0; // unset: 3 with --before, else 1
    std::string before;
    bool starvation_only = false;
    std::string only_store; // "pg" or "dir": that store only
    std::vector<std::string> server_flags{"--quiet"}; // --server-flag: more of imserver's flags
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--mib")) mib = static_cast<std::size_t>(std::atol(im::bench::flag_value(argc, argv, i).c_str()));
        else if (!std::strcmp(argv[i], "--uploads")) uploads = std::atoi(im::bench::flag_value(argc, argv, i).c_str());
        else if (!std::strcmp(argv[i], "--senders")) senders = std::atoi(im::bench::flag_value(argc, argv, i).c_str());
        else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(im::bench::flag_value(argc, argv, i).c_str());
        else if (!std::strcmp(argv[i], "--before")) before = im::bench::flag_value(argc, argv, i);
        else if (!std::strcmp(argv[i], "--rounds")) rounds = std::max(1, std::atoi(im::bench::flag_value(argc, argv, i).c_str()));
        else if (!std::strcmp(argv[i], "--starvation-only")) starvation_only = true;
        else if (!std::strcmp(argv[i], "--store")) only_store = im::bench::flag_value(argc, argv, i);
        else if (!std::strcmp(argv[i], "--server-flag")) server_flags.push_back(im::bench::flag_value(argc, argv, i));
        else {
            std::fprintf(stderr, "usage: bench_attachments [--mib N] [--uploads K] [--senders S] [--seconds T] "
                                 "[--rounds R] [--starvation-only] [--store pg|dir] [--server-flag F]...\n"
                                 "       bench_attachments --before IMSERVER [--rounds R] [--mib N]\n");
            return 2;
        }
    }
    if (const char* m = std::getenv("IM_BENCH_ATTACHMENT_MIB"); m && *m) mib = static_cast<std::size_t>(std::atol(m));
    const char* env = std::getenv("IMSERVER_BIN");
    ::setenv("IMSERVER_BIN", env && *env ? env : im::test::exe_relative(IMSERVER_BIN_DEFAULT).c_str(), 1);
    try {
        TestPostgres pg;
        TempDir tmp("imbatt");
        std::printf("bench_attachments: %zu MiB file, %d uploaders, %d senders, %.1f s windows (loopback)\n", mib,
                    uploads, senders, seconds);
        if (!before.empty()) {
            alternate(pg, tmp.path(), mib, rounds > 0 ? rounds : 3, before, std::getenv("IMSERVER_BIN"));
            return 0;
        }
        rounds = std::max(1, rounds);
        if (only_store != "dir")
            run_store(pg, "pg", server_flags, tmp.path(), mib, uploads, senders, seconds, rounds, starvation_only);
        auto dir_flags = server_flags;
        dir_flags.insert(dir_flags.end(), {"--attachments-dir", tmp.path() + "/store"});
        if (only_store != "pg")
            run_store(pg, "dir", dir_flags, tmp.path(), mib, uploads,
                      senders, seconds, rounds, starvation_only);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_attachments: %s\n", e.what());
        return 1;
    }
    return 0;
}

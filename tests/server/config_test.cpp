// The configuration: one table gives each option a flag, an environment
// variable and a file key; flag > env > file > default; --print-config masks
// secrets; the manual pages list what --help lists. Runs the real binary.
#include "core/config.hpp"
#include "harness.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <sys/wait.h>

namespace im::test {
namespace {

struct Run {
    int code = -1;
    std::string out, err;
};

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::trunc);
    f << text;
}

// Runs imserver with an environment prefix ("A=1 B=2") in a clean
// environment as far as IM_* goes.
Run run_imserver(const TempDir& dir, const std::string& env, const std::string& args) {
    std::string out = dir.path() + "/out", err = dir.path() + "/err";
    std::string cmd = "cd '" + dir.path() + "' && env $(env | grep -o '^IM_[A-Z_]*' | sed 's/^/-u /') " + env + " '" + imserver_bin() + "' " +
                      args + " >'" + out + "' 2>'" + err + "'";
    int st = std::system(cmd.c_str());
    return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(out), slurp(err)};
}

// The line "key = value  # origin" of --print-config.
std::string line_of(const std::string& printed, const std::string& key) {
    std::istringstream in(printed);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key + " =", 0) == 0 || line.rfind("# " + key + " =", 0) == 0) return line;
    return "(no line for " + key + ")";
}

TEST(Config, flag_beats_environment_beats_file_beats_default) {
    TempDir dir("imcfg");
    const std::string conf = dir.path() + "/imserver.conf";
    write(conf,
          "# a comment\n"
          "db-pool = 3\n"
          "\n"
          "io-threads = 3\n"
          "gateway-id = from-file\n"
          "quiet = true\n");
    auto r = run_imserver(dir, "IM_DB_POOL=5 IM_IO_THREADS=5", "--config " + conf + " --db-pool 7 --print-config");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(line_of(r.out, "db-pool").substr(0, 11), "db-pool = 7");
    EXPECT_NE(line_of(r.out, "db-pool").find("# flag"), std::string::npos);
    EXPECT_EQ(line_of(r.out, "io-threads").substr(0, 14), "io-threads = 5");
    EXPECT_NE(line_of(r.out, "io-threads").find("# env IM_IO_THREADS"), std::string::npos);
    EXPECT_EQ(line_of(r.out, "gateway-id").substr(0, 22), "gateway-id = from-file");
    EXPECT_NE(line_of(r.out, "gateway-id").find(conf + ":5"), std::string::npos);
    EXPECT_EQ(line_of(r.out, "quiet").substr(0, 12), "quiet = true");
    // auto: --max-connections (docs/benchmarks.md, "Reconnect storm").
    EXPECT_EQ(line_of(r.out, "db-queue").substr(0, 15), "db-queue = auto");
    EXPECT_NE(line_of(r.out, "db-queue").find("# default"), std::string::npos);
}

// Contract section 3: a ping every 20 s and a silent connection closed
// after 60 s, by default (the behaviour itself is tested with short values
// in the resilience test; these are the values a default start runs with).
TEST(Config, the_default_ping_period_is_20_s_and_the_idle_limit_60_s) {
    TempDir dir("imcfg");
    auto r = run_imserver(dir, "", "--config '' --print-config");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(line_of(r.out, "ping-interval-ms").substr(0, 24), "ping-interval-ms = 20000");
    EXPECT_NE(line_of(r.out, "ping-interval-ms").find("# default"), std::string::npos);
    EXPECT_EQ(line_of(r.out, "idle-timeout-ms").substr(0, 23), "idle-timeout-ms = 60000");
    EXPECT_NE(line_of(r.out, "idle-timeout-ms").find("# default"), std::string::npos);
}

TEST(Config, printed_configuration_reads_back_as_the_same_configuration) {
    TempDir dir("imcfg");
    auto first = run_imserver(dir, "IM_GATEWAY_ID=gw-x IM_LISTEN=0.0.0.0:9443",
                              "--config '' --drain-timeout-ms 2500 --print-config");
    ASSERT_EQ(first.code, 0) << first.err;
    write(dir.path() + "/saved.conf", first.out);
    auto again = run_imserver(dir, "", "--config " + dir.path() + "/saved.conf --print-config");
    ASSERT_EQ(again.code, 0) << again.err;
    for (const char* key : {"listen", "gateway-id", "drain-timeout-ms", "db-pool", "quiet"})
        EXPECT_EQ(line_of(again.out, key).substr(0, line_of(again.out, key).find('#', 2)),
                  line_of(first.out, key).substr(0, line_of(first.out, key).find('#', 2)))
            << key;
}

TEST(Config, print_config_masks_database_passwords_and_reads_the_password_file) {
    TempDir dir("imcfg");
    write(dir.path() + "/pw", "s3cr3t-from-file\n");
    write(dir.path() + "/c.conf", "db = postgresql://im:inline-secret@db1/im?sslmode=require\n"
                                  "db-password-file = " + dir.path() + "/pw\n");
    auto r = run_imserver(dir, "", "--config " + dir.path() + "/c.conf --print-config");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.find("s3cr3t"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("inline-secret"), std::string::npos) << r.out;
    EXPECT_NE(line_of(r.out, "db").find("postgresql://im:****@db1/im?sslmode=require"), std::string::npos) << r.out;

    auto kv = run_imserver(dir, "IM_DB='host=db1 password=hunter2 dbname=im'", "--config '' --print-config");
    ASSERT_EQ(kv.code, 0) << kv.err;
    EXPECT_EQ(kv.out.find("hunter2"), std::string::npos) << kv.out;
    EXPECT_NE(line_of(kv.out, "db").find("host=db1 password=**** dbname=im"), std::string::npos) << kv.out;
}

TEST(Config, password_file_is_added_to_the_connection_string) {
    Config c;
    c.db_url = "postgresql://im@db1/im";
    c.db_password = "p@ss word'\\";
    EXPECT_EQ(*db_conninfo(c), "postgresql://im@db1/im?password=p%40ss%20word%27%5C");
    c.db_url = "postgresql://im@db1/im?sslmode=require";
    EXPECT_EQ(*db_conninfo(c), "postgresql://im@db1/im?sslmode=require&password=p%40ss%20word%27%5C");
    c.db_url = "host=db1 dbname=im";
    EXPECT_EQ(*db_conninfo(c), "host=db1 dbname=im password='p@ss word\\'\\\\'");
    c.db_password.clear();
    EXPECT_EQ(*db_conninfo(c), "host=db1 dbname=im");
}

TEST(Config, send_workers_are_half_the_cores_by_default_and_never_more_than_the_pool) {
    const int half = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
    Config c;
    c.db_pool = 64;
    EXPECT_EQ(effective_send_workers(c), std::min(half, 64)); // auto
    c.db_pool = 1;
    EXPECT_EQ(effective_send_workers(c), 1);
    c.db_pool = 16;
    c.send_workers = 3;
    EXPECT_EQ(effective_send_workers(c), 3);
    c.db_pool = 2;
    EXPECT_EQ(effective_send_workers(c), 2);

    TempDir dir("imcfg");
    auto r = run_imserver(dir, "IM_SEND_WORKERS=5", "--config '' --print-config");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(line_of(r.out, "send-workers").substr(0, 16), "send-workers = 5");
    r = run_imserver(dir, "", "--config '' --send-workers auto --print-config");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(line_of(r.out, "send-workers").substr(0, 19), "send-workers = auto");
    for (const char* bad : {"0", "many", "-1"}) {
        r = run_imserver(dir, "", std::string("--config '' --send-workers ") + bad + " --print-config");
        EXPECT_EQ(r.code, 2) << bad;
        EXPECT_NE(r.err.find("send-workers"), std::string::npos) << r.err;
    }
}

// --trusted-proxies (server.md, "Scaling out"): CIDR ranges, a bare
// address being one host; a range with bits set past its prefix is refused
// (a typo for the network or for one host?), and so is anything else.
TEST(Config, cidr_ranges_parse_and_contain_what_they_should) {
    IpNetwork n;
    ASSERT_EQ(parse_cidr("10.0.0.0/8", n), std::nullopt);
    EXPECT_TRUE(n.contains(*parse_ip("10.255.1.2")));
    EXPECT_TRUE(n.contains(*parse_ip("::ffff:10.1.2.3"))) << "IPv4-mapped IPv6 is the IPv4 address";
    EXPECT_FALSE(n.contains(*parse_ip("11.0.0.1")));
    EXPECT_FALSE(n.contains(*parse_ip("::a00:1"))) << "an IPv4 range holds no native IPv6 address";
    EXPECT_EQ(to_string(n), "10.0.0.0/8");

    ASSERT_EQ(parse_cidr("192.0.2.7", n), std::nullopt);
    EXPECT_EQ(n.prefix, 128);
    EXPECT_TRUE(n.contains(*parse_ip("192.0.2.7")));
    EXPECT_FALSE(n.contains(*parse_ip("192.0.2.8")));
    EXPECT_EQ(to_string(n), "192.0.2.7/32");

    ASSERT_EQ(parse_cidr("2001:db8::/32", n), std::nullopt);
    EXPECT_TRUE(n.contains(*parse_ip("2001:db8:ffff::1")));
    EXPECT_FALSE(n.contains(*parse_ip("2001:db9::1")));
    ASSERT_EQ(parse_cidr("2001:db8:0:2::/63", n), std::nullopt) << "a prefix that ends inside a byte";
    EXPECT_TRUE(n.contains(*parse_ip("2001:db8:0:2::5")));
    EXPECT_TRUE(n.contains(*parse_ip("2001:db8:0:3::5")));
    EXPECT_FALSE(n.contains(*parse_ip("2001:db8:0:1::5")));
    EXPECT_FALSE(n.contains(*parse_ip("2001:db8:0:4::5")));
    EXPECT_TRUE(parse_cidr("2001:db8:0:1::/63", n).has_value()) << "bit 63 is past a /63";
    ASSERT_EQ(parse_cidr("0.0.0.0/0", n), std::nullopt);
    EXPECT_TRUE(n.contains(*parse_ip("203.0.113.9")));
    EXPECT_FALSE(n.contains(*parse_ip("2001:db8::1")));

    const IpNetwork before = n;
    for (const char* bad : {"10.0.0.1/8", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/8x", "2001:db8::/129",
                            "2001:db8::1/32", "10.0.0", "example.com", "", "[::1]", "10.0.0.0/8/8"}) {
        auto e = parse_cidr(bad, n);
        EXPECT_TRUE(e.has_value()) << bad;
        EXPECT_EQ(n, before) << bad << ": a refused range changes nothing";
    }
    EXPECT_NE(parse_cidr("10.0.0.1/8", n).value_or("").find("10.0.0.0/8"), std::string::npos)
        << "the message names the range that was probably meant";

    std::vector<IpNetwork> list;
    ASSERT_EQ(parse_cidr_list(" 10.0.0.0/8, 192.0.2.7 ,2001:db8::/32", list), std::nullopt);
    ASSERT_EQ(list.size(), 3u);
    EXPECT_TRUE(in_any(list, *parse_ip("192.0.2.7")));
    EXPECT_FALSE(in_any(list, *parse_ip("192.0.2.6")));
    EXPECT_TRUE(parse_cidr_list("10.0.0.0/8,,192.0.2.7", list).has_value());
    EXPECT_EQ(list.size(), 3u) << "a refused list changes nothing";
    ASSERT_EQ(parse_cidr_list("", list), std::nullopt);
    EXPECT_TRUE(list.empty());
}

// Every per-address limit counts IPv4 as itself (IPv4-mapped IPv6 too) and
// IPv6 by its /64.
TEST(Config, limits_key_ipv6_by_its_64_and_ipv4_mapped_as_ipv4) {
    EXPECT_EQ(address_key("192.0.2.7"), "192.0.2.7");
    EXPECT_EQ(address_key("::ffff:192.0.2.7"), "192.0.2.7");
    EXPECT_EQ(address_key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
    EXPECT_EQ(address_key("2001:db8:1:2:bbbb::9"), "2001:db8:1:2::/64");
    EXPECT_NE(address_key("2001:db8:1:3::1"), address_key("2001:db8:1:2::1"));
    EXPECT_EQ(address_key("not an address"), "not an address");
}

TEST(Config, trusted_proxies_from_flag_environment_and_file) {
    TempDir dir("imcfg");
    auto r = run_imserver(dir, "IM_TRUSTED_PROXIES='10.0.0.0/8, 2001:db8::/32'", "--config '' --print-config");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(line_of(r.out, "trusted-proxies").substr(0, 42), "trusted-proxies = 10.0.0.0/8,2001:db8::/32");
    EXPECT_NE(line_of(r.out, "trusted-proxies").find("# env IM_TRUSTED_PROXIES"), std::string::npos);
    write(dir.path() + "/saved.conf", r.out);
    auto again = run_imserver(dir, "", "--config " + dir.path() + "/saved.conf --print-config");
    ASSERT_EQ(again.code, 0) << again.err;
    EXPECT_EQ(line_of(again.out, "trusted-proxies").substr(0, 42), "trusted-proxies = 10.0.0.0/8,2001:db8::/32");

    r = run_imserver(dir, "", "--config '' --trusted-proxies 10.0.0.1/8 --print-config");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("trusted-proxies"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("bits set past its prefix"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());
}

TEST(Config, bad_file_lines_are_refused_with_file_and_line) {
    TempDir dir("imcfg");
    const std::string conf = dir.path() + "/bad.conf";
    write(conf, "db-pool = 2\n\ndb-pol = 3\n");
    auto r = run_imserver(dir, "", "--config " + conf + " --print-config");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find(conf + ":3: unknown key 'db-pol'"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());

    write(conf, "quiet = maybe\n");
    r = run_imserver(dir, "", "--config " + conf + " --print-config");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find(conf + ":1: expected true or false"), std::string::npos) << r.err;

    write(conf, "io-threads = 0\n");
    r = run_imserver(dir, "", "--config " + conf);
    EXPECT_EQ(r.code, 2) << "a bad value must stop the gateway before it starts";
    EXPECT_NE(r.err.find(conf + ":1: expected an integer in [1, 64]"), std::string::npos) << r.err;

    r = run_imserver(dir, "", "--config " + dir.path() + "/missing.conf --print-config");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("cannot read configuration file"), std::string::npos) << r.err;

    r = run_imserver(dir, "", "--config '' --db-password-file " + dir.path() + "/nope --db host=x --print-config");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--db-password-file: cannot read"), std::string::npos) << r.err;
}

TEST(Config, admin_reads_the_same_file_and_refuses_gateway_only_flags) {
    TempDir dir("imcfg");
    write(dir.path() + "/c.conf", "db-pool = 2\nbogus = 1\n");
    auto r = run_imserver(dir, "", "admin --config " + dir.path() + "/c.conf user add x");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("c.conf:2: unknown key 'bogus'"), std::string::npos) << r.err;
    r = run_imserver(dir, "", "admin --config '' --db-pool 3 user add x");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("unknown option '--db-pool'"), std::string::npos) << r.err;
}

// The manual pages come from the tables --help prints: every flag of one is
// in the other.
TEST(Config, manual_pages_list_every_option_of_help) {
    const char* man_dir = std::getenv("IMSERVER_MAN_DIR");
    ASSERT_NE(man_dir, nullptr);
    TempDir dir("imcfg");
    for (const auto& [args, page] : {std::pair{std::string("--help"), std::string("imserver.8")},
                                     std::pair{std::string("admin --help"), std::string("imserver-admin.8")}}) {
        auto help = run_imserver(dir, "", args);
        ASSERT_EQ(help.code, 0);
        std::string unz = dir.path() + "/" + page;
        ASSERT_EQ(std::system(("gzip -dc '" + std::string(man_dir) + "/" + page + ".gz' >'" + unz + "'").c_str()), 0);
        std::string man = slurp(unz);
        std::regex flag(R"((^|\s)(--[a-z-]+))");
        int n = 0;
        for (auto it = std::sregex_iterator(help.out.begin(), help.out.end(), flag); it != std::sregex_iterator(); ++it) {
            std::string f = (*it)[2];
            std::string roff;
            for (char ch : f) roff += ch == '-' ? std::string("\\-") : std::string(1, ch);
            EXPECT_NE(man.find(roff), std::string::npos) << page << " lacks " << f;
            ++n;
        }
        EXPECT_GT(n, 5) << args;
    }
}

} // namespace
} // namespace im::test

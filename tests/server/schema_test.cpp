// The schema on a real PostgreSQL: the rules a distributed PostgreSQL
// (events and their companions spread by conversation) puts on it, read from
// the catalog after the real migrations ran. See docs/scaling.md.
#include "common.hpp"

#include "store/database.hpp"
#include "store/migrations.hpp"

#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace im::test;

namespace {

// Tables that carry conv_id are the ones a distributed PostgreSQL shards by it.
const char* const sharded_tables_sql =
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "JOIN pg_attribute a ON a.attrelid = c.oid "
    "WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attname = 'conv_id' AND NOT a.attisdropped "
    "ORDER BY 1";

// Every unique index (primary keys and unique constraints included) of those
// tables, with whether conv_id is one of its key columns.
const char* const unique_indexes_sql =
    "SELECT t.relname, i.relname, "
    "       EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.oid AND a.attname = 'conv_id' "
    "               AND a.attnum = ANY (x.indkey::int2[])) "
    "FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid "
    "JOIN pg_namespace n ON n.oid = t.relnamespace "
    "WHERE n.nspname = 'public' AND x.indisunique "
    "  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.oid AND a.attname = 'conv_id' "
    "              AND NOT a.attisdropped) "
    "ORDER BY 1, 2";

TEST(Schema, every_unique_index_of_the_tables_sharded_by_conversation_includes_conv_id) {
    TestPostgres pg;
    pqxx::connection c(pg.url());
    im::migrate(c);
    pqxx::nontransaction tx(c);

    std::set<std::string> sharded;
    for (const auto& row : tx.exec(sharded_tables_sql)) sharded.insert(row[0].c_str());
    for (const char* t : {"conversations", "events", "membership_periods", "idem_tombstones", "delivery_markers",
                          "read_markers"})
        EXPECT_TRUE(sharded.count(t)) << t << " has no conv_id column any more";

    std::set<std::string> checked;
    for (const auto& row : tx.exec(unique_indexes_sql)) {
        std::string table = row[0].c_str(), index = row[1].c_str();
        checked.insert(index);
        EXPECT_TRUE(row[2].as<bool>()) << "unique index " << index << " on " << table << " does not include conv_id";
    }
    // The check saw the indexes that matter (it cannot pass on an empty catalog).
    for (const char* i : {"events_pkey", "events_idempotency", "events_recall_target",
                          "membership_open_period", "idem_tombstones_pkey"})
        EXPECT_TRUE(checked.count(i)) << i << " was not seen";
}

// Rows in every table of the baseline, as a database in use has them.
void add_data(pqxx::connection& c) {
    pqxx::work tx(c);
    tx.exec("INSERT INTO users (user_id) VALUES ('u1'), ('u2')");
    tx.exec("INSERT INTO devices (device_id, user_id, token_sha256) VALUES ('d1', 'u1', '\\x01'), ('d2', 'u2', '\\x02')");
    tx.exec("INSERT INTO conversations (conv_id, kind, next_seq, msg_count) VALUES ('c1', 'group', 4, 1)");
    tx.exec("INSERT INTO membership_periods (conv_id, user_id, from_seq) VALUES ('c1', 'u1', 1), ('c1', 'u2', 2)");
    tx.exec("INSERT INTO events (conv_id, seq, kind, subject_user, epoch, msg_ordinal) VALUES "
            "('c1', 1, 'join', 'u1', 1, 0), ('c1', 2, 'join', 'u2', 1, 0)");
    tx.exec("INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, request_hash, body, epoch, "
            "msg_ordinal, sender_ordinal) VALUES ('c1', 3, 'msg', 'u1', 'k1', '\\x00', 'hello', 1, 1, 1)");
    tx.exec("INSERT INTO delivery_markers (conv_id, device_id, delivered) VALUES ('c1', 'd2', 3)");
    tx.exec("INSERT INTO read_markers (conv_id, user_id, read) VALUES ('c1', 'u2', 3)");
    tx.commit();
}

// The embedded schema with one change to the function file `name`: the next
// version of the function set (`version_step` 0: the same version, a build
// of a version corrected before its release).
im::Schema with_function_changed(const std::string& name, const std::string& marker, int version_step = 1) {
    im::Schema s = im::embedded_schema();
    s.function_version += version_step;
    for (auto& f : s.functions)
        if (f.name == name) {
            // the body of the function the file is named after (im_send.sql
            // defines im_lock_runs before im_send)
            const auto at = f.sql.find("BEGIN\n", f.sql.find("FUNCTION " + name + "("));
            EXPECT_NE(at, std::string::npos);
            f.sql.insert(at + 6, "    -- " + marker + "\n");
        }
    return s;
}

std::string im_send_source(TestPostgres& pg, const std::string& db = "im") {
    return pg.scalar("SELECT prosrc FROM pg_proc WHERE proname = 'im_send'", db);
}

// PostgreSQL 14 is the oldest the schema runs on (client_connection_check_
// interval, a SQL-standard function body): server_version_num below 140000
// is refused with the major version named; the real cluster here is newer.
TEST(PostgresVersion, fourteen_and_newer_are_accepted_and_older_ones_refused_by_name) {
    for (int ok : {140000, 140011, 150004, 160000, 170002, 999999})
        EXPECT_EQ(im::unsupported_postgres(ok), std::nullopt) << ok;
    struct Old {
        int num;
        const char* named;
    };
    for (const Old& o : {Old{139999, "PostgreSQL 13 "}, Old{130014, "PostgreSQL 13 "}, Old{120000, "PostgreSQL 12 "},
                         Old{100023, "PostgreSQL 10 "}, Old{90624, "PostgreSQL 9.6 "}, Old{90500, "PostgreSQL 9.5 "}}) {
        const auto why = im::unsupported_postgres(o.num);
        ASSERT_TRUE(why) << o.num;
        EXPECT_NE(why->find(o.named), std::string::npos) << *why;
        EXPECT_NE(why->find("needs PostgreSQL 14 or newer"), std::string::npos) << *why;
    }
    TestPostgres pg;
    EXPECT_GE(std::stoi(pg.scalar("SHOW server_version_num")), im::min_server_version_num);
}

// The function files are the newest version of schema/functions/versions.txt
// (the build checks it too: server_function_versions_check), and the
// embedded schema carries that version and version 1's checksums.
TEST(Schema, the_function_files_are_the_newest_recorded_version_of_the_set) {
    const im::Schema& s = im::embedded_schema();
    std::map<std::string, std::string> newest;
    int top = 0;
    for (const auto& e : im::function_set_history()) top = std::max(top, e.version);
    for (const auto& e : im::function_set_history())
        if (e.version == top) newest[e.name] = e.checksum;
    EXPECT_EQ(s.function_version, top);
    ASSERT_EQ(newest.size(), s.functions.size());
    for (const auto& f : s.functions) EXPECT_EQ(newest[f.name], im::schema_checksum(f.sql)) << f.name;
    EXPECT_FALSE(s.legacy_function_checksums.empty());
    for (const auto& [name, sum] : s.legacy_function_checksums) EXPECT_EQ(sum.size(), 64u) << name;
}

TEST(Schema, exactly_one_function_file_defines_im_send_and_the_baseline_defines_no_function) {
    int defining = 0;
    for (const auto& f : im::all_functions())
        if (f.sql.find("FUNCTION im_send(") != std::string::npos) ++defining;
    EXPECT_EQ(defining, 1);
    for (const auto& m : im::all_migrations())
        EXPECT_EQ(m.sql.find("FUNCTION im_send("), std::string::npos) << m.name << " defines im_send";
    ASSERT_FALSE(im::all_migrations().empty());
    EXPECT_EQ(im::all_migrations().front().name, "001_baseline");
}

TEST(Schema, a_changed_applied_migration_refuses_to_start_and_makes_readyz_503) {
    TestPostgres pg;
    {
        pqxx::connection c(pg.url());
        im::migrate(c);
        // The file of an applied migration edited afterwards: migrate refuses
        // before it alters anything.
        im::Schema edited = im::embedded_schema();
        edited.migrations.front().sql += "\nCREATE TABLE sneaked_in (x int);\n";
        edited.functions.front().sql += "\n-- changed too\n";
        const std::string sums = "SELECT string_agg(name || ' ' || checksum, ',' ORDER BY name) FROM schema_functions";
        const std::string before = pg.scalar(sums);
        EXPECT_THROW(im::migrate(c, edited), im::SchemaMismatch);
        EXPECT_EQ(pg.scalar("SELECT count(*) FROM pg_class WHERE relname = 'sneaked_in'"), "0");
        EXPECT_EQ(pg.scalar(sums), before) << "a refused start applied a function";
        EXPECT_TRUE(im::migrations_current(c));
        EXPECT_FALSE(im::migrations_current(c, edited));
    }
    ServerProcess srv(pg.url(), {"--quiet"});
    ASSERT_TRUE(wait_until([&] { return srv.http("GET", "/readyz").first == 200; }, 30s));
    // The same seen from the database's side: its record of migration 1 no
    // longer matches the binary's file.
    const std::string sum = pg.scalar("SELECT checksum FROM schema_migrations WHERE version = 1");
    ASSERT_EQ(sum.size(), 64u);
    pg.scalar("UPDATE schema_migrations SET checksum = repeat('0', 64) WHERE version = 1");
    EXPECT_TRUE(wait_until([&] { return srv.http("GET", "/readyz").first == 503; }, 30s))
        << "a running gateway must turn unready when an applied migration differs";
    EXPECT_EQ(imserver_exit_code({"--db", pg.url(), "--listen", "127.0.0.1:0", "--quiet"}, 60s), 1)
        << "a start must refuse a database whose applied migration differs from its file";
    try {
        ServerProcess refused(pg.url(), {});
        ADD_FAILURE() << "the second gateway started";
    } catch (const std::exception& e) {
        const std::string log = e.what();
        EXPECT_NE(log.find("schema_migration_changed"), std::string::npos) << log;
        EXPECT_NE(log.find("001_baseline"), std::string::npos) << log;
    }
    pg.scalar("UPDATE schema_migrations SET checksum = " + q(sum) + " WHERE version = 1");
    EXPECT_TRUE(wait_until([&] { return srv.http("GET", "/readyz").first == 200; }, 30s));
}

std::string recorded_function_version(TestPostgres& pg) {
    return pg.scalar("SELECT max(version) FROM schema_function_set");
}

TEST(Schema, a_changed_function_file_is_applied_on_the_next_start_and_only_then) {
    TestPostgres pg;
    pqxx::connection c(pg.url());
    const int version = im::embedded_schema().function_version;
    auto first = im::migrate(c);
    EXPECT_EQ(first.migrations, static_cast<int>(im::all_migrations().size()));
    EXPECT_EQ(first.functions, static_cast<int>(im::all_functions().size()));
    EXPECT_EQ(first.database_function_version, version);
    EXPECT_EQ(recorded_function_version(pg), std::to_string(version));
    auto again = im::migrate(c);
    EXPECT_EQ(again.migrations, 0);
    EXPECT_EQ(again.functions, 0) << "an unchanged function file was applied again";

    const auto changed = with_function_changed("im_send", "revision two");
    auto next = im::migrate(c, changed);
    EXPECT_EQ(next.migrations, 0);
    EXPECT_EQ(next.functions, 1);
    EXPECT_EQ(next.database_function_version, version + 1);
    EXPECT_NE(im_send_source(pg).find("revision two"), std::string::npos) << "the changed file was not applied";
    for (const auto& f : changed.functions) {
        if (f.name != "im_send") continue;
        EXPECT_EQ(pg.scalar("SELECT checksum || ' ' || version FROM schema_function_files WHERE name = 'im_send'"),
                  im::schema_checksum(f.sql) + " " + std::to_string(version + 1));
    }
    EXPECT_EQ(im::migrate(c, changed).functions, 0);
    // A build of the same version whose file was corrected before its
    // release: applied (said in the log), the version stays.
    auto corrected = with_function_changed("im_send", "revision two, corrected", 0);
    corrected.function_version = version + 1;
    EXPECT_EQ(im::migrate(c, corrected).functions, 1);
    EXPECT_NE(im_send_source(pg).find("revision two, corrected"), std::string::npos);
    EXPECT_EQ(recorded_function_version(pg), std::to_string(version + 1));
}

// A gateway of the previous release restarting during a rolling upgrade (or
// a rollback) must not put its older functions back under the newer
// gateways: it leaves them alone and serves on them. Two builds here: the
// embedded schema and the same with im_send changed in a new version.
TEST(Schema, an_older_function_set_is_never_applied_over_a_newer_one) {
    TestPostgres pg;
    pqxx::connection c(pg.url());
    const im::Schema& older = im::embedded_schema();
    im::migrate(c, older);
    const auto newer = with_function_changed("im_send", "the newer set");
    EXPECT_EQ(im::migrate(c, newer).functions, 1);
    const std::string files = "SELECT string_agg(name || ' ' || checksum || ' ' || version, ',' ORDER BY name) "
                              "FROM schema_function_files";
    const std::string before = pg.scalar(files);
    auto back = im::migrate(c, older);
    EXPECT_EQ(back.functions, 0) << "the older set was applied over the newer one";
    EXPECT_EQ(back.database_function_version, newer.function_version);
    EXPECT_NE(im_send_source(pg).find("the newer set"), std::string::npos) << "the older im_send is back";
    EXPECT_EQ(pg.scalar(files), before);
    EXPECT_EQ(recorded_function_version(pg), std::to_string(newer.function_version));
    // The gateways of the releases before function-set versions compare
    // their files with schema_functions and re-apply what differs: it holds
    // version 1's checksums (theirs), so they leave the newer set alone too.
    for (const auto& e : im::function_set_history()) {
        if (e.version != 1) continue;
        EXPECT_EQ(pg.scalar("SELECT checksum FROM schema_functions WHERE name = " + q(e.name)), e.checksum) << e.name;
    }
}

// The same with two real binaries: the build's imserver and imserver_next,
// the same tree with im_send changed and the function set one version higher
// (tests/server/CMakeLists.txt).
TEST(Schema, an_older_gateway_restarting_in_a_rolling_upgrade_serves_on_the_newer_functions) {
    const char* next_bin = std::getenv("IMSERVER_NEXT_BIN");
    ASSERT_TRUE(next_bin && *next_bin) << "IMSERVER_NEXT_BIN is not set";
    const std::string this_bin = im::test::imserver_bin();
    const int version = im::embedded_schema().function_version;
    TestPostgres pg;
    ServerProcess old_gw(pg.url(), {}, "gw-old");
    EXPECT_EQ(recorded_function_version(pg), std::to_string(version));
    EXPECT_EQ(im_send_source(pg).find("imserver_next"), std::string::npos);

    // The upgrade begins: a second gateway runs the next build.
    ::setenv("IMSERVER_BIN", next_bin, 1);
    std::unique_ptr<ServerProcess> new_gw;
    try {
        new_gw = std::make_unique<ServerProcess>(pg.url(), std::vector<std::string>{}, "gw-new");
    } catch (...) {
        ::setenv("IMSERVER_BIN", this_bin.c_str(), 1);
        throw;
    }
    ::setenv("IMSERVER_BIN", this_bin.c_str(), 1);
    EXPECT_EQ(recorded_function_version(pg), std::to_string(version + 1));
    EXPECT_NE(im_send_source(pg).find("imserver_next"), std::string::npos) << new_gw->log();
    EXPECT_NE(new_gw->log().find("\"msg\":\"function_set_applied\""), std::string::npos) << new_gw->log();

    // The old gateway restarts before its turn (or is rolled back to).
    const std::size_t seen = old_gw.log().size();
    old_gw.restart();
    ASSERT_TRUE(wait_until([&] { return old_gw.http("GET", "/readyz").first == 200; }, 30s)) << old_gw.log();
    const std::string restart_log = old_gw.log().substr(seen);
    EXPECT_NE(restart_log.find("\"msg\":\"functions_newer_in_database\""), std::string::npos) << restart_log;
    EXPECT_EQ(restart_log.find("\"msg\":\"function_applied\""), std::string::npos) << restart_log;
    EXPECT_NE(im_send_source(pg).find("imserver_next"), std::string::npos)
        << "the older gateway put its im_send back over the newer one";
    EXPECT_EQ(recorded_function_version(pg), std::to_string(version + 1));

    // Both serve, on the newer function: a send through each.
    auto w = make_world(pg.url(), "roll", 2);
    auto a = login(old_gw.port(), w.users[0]);
    auto b = login(new_gw->port(), w.users[1]);
    auto sa = send_msg(*a, w.conv, "via-old", "from the older gateway");
    auto sb = send_msg(*b, w.conv, "via-new", "from the newer gateway");
    EXPECT_EQ(str(sa, "t"), "sent") << json::serialize(sa);
    EXPECT_EQ(str(sb, "t"), "sent") << json::serialize(sb);

    // The newer gateway restarting finds its own set: nothing applied.
    const std::size_t seen_new = new_gw->log().size();
    new_gw->restart();
    EXPECT_EQ(new_gw->log().substr(seen_new).find("\"msg\":\"function_applied\""), std::string::npos)
        << new_gw->log().substr(seen_new);

    // A rollback for good (docs/operations.md, "The function set's
    // version"): the newer gateways stopped, the newer sets forgotten, an
    // older gateway applies its own files.
    new_gw.reset();
    const std::string n = std::to_string(version);
    pg.scalar("DELETE FROM schema_function_files WHERE version > " + n +
              "; DELETE FROM schema_function_set WHERE version > " + n);
    const std::size_t seen_back = old_gw.log().size();
    old_gw.restart();
    EXPECT_NE(old_gw.log().substr(seen_back).find("\"msg\":\"function_applied\""), std::string::npos)
        << old_gw.log().substr(seen_back);
    EXPECT_EQ(im_send_source(pg).find("imserver_next"), std::string::npos)
        << "the rollback did not apply the older im_send";
    EXPECT_EQ(recorded_function_version(pg), n);
}

TEST(Schema, gateways_starting_together_apply_each_migration_and_changed_function_once) {
    TestPostgres pg;
    constexpr int gateways = 6;
    auto together = [&](const im::Schema& schema) {
        std::vector<im::MigrateResult> results(gateways);
        std::vector<std::thread> threads;
        for (int i = 0; i < gateways; ++i)
            threads.emplace_back([&, i] {
                pqxx::connection c(pg.url());
                results[i] = im::migrate(c, schema);
            });
        for (auto& t : threads) t.join();
        im::MigrateResult sum;
        for (const auto& r : results) {
            sum.migrations += r.migrations;
            sum.functions += r.functions;
        }
        return sum;
    };
    auto fresh = together(im::embedded_schema());
    EXPECT_EQ(fresh.migrations, static_cast<int>(im::all_migrations().size()));
    EXPECT_EQ(fresh.functions, static_cast<int>(im::all_functions().size()));
    auto changed = together(with_function_changed("im_send", "applied once"));
    EXPECT_EQ(changed.migrations, 0);
    EXPECT_EQ(changed.functions, 1) << "the changed function was applied more than once (or not at all)";
    EXPECT_NE(im_send_source(pg).find("applied once"), std::string::npos);
    // Real gateways too: two processes started at once on a database whose
    // recorded set is older than theirs (none recorded) and whose files differ.
    pg.scalar("DELETE FROM schema_function_set");
    pg.scalar("UPDATE schema_function_files SET checksum = 'stale'");
    std::unique_ptr<ServerProcess> a, b;
    std::thread ta([&] { a = std::make_unique<ServerProcess>(pg.url(), std::vector<std::string>{}, "gw-a"); });
    std::thread tb([&] { b = std::make_unique<ServerProcess>(pg.url(), std::vector<std::string>{}, "gw-b"); });
    ta.join();
    tb.join();
    ASSERT_TRUE(a && b);
    auto applied = [](const ServerProcess& s) {
        std::size_t n = 0;
        for (auto at = s.log().find("function_applied"); at != std::string::npos;
             at = s.log().find("function_applied", at + 1))
            ++n;
        return n;
    };
    EXPECT_EQ(applied(*a) + applied(*b), im::all_functions().size());
    EXPECT_EQ(im_send_source(pg).find("applied once"), std::string::npos);
}

TEST(Schema, the_baseline_then_each_later_migration_applies_to_a_database_with_data_and_numbers_may_have_gaps) {
    TestPostgres pg;
    pqxx::connection c(pg.url());
    const auto& all = im::all_migrations();
    im::Schema s;
    s.migrations.push_back(all.front());
    EXPECT_EQ(im::migrate(c, s).migrations, 1);
    add_data(c);
    // Each later migration of schema/, one start at a time, then two more
    // with gaps in their numbers (branches number theirs independently).
    std::vector<im::Migration> later(all.begin() + 1, all.end());
    const int top = all.back().version;
    later.push_back({top + 3, std::to_string(top + 3) + "_gap_a", "CREATE TABLE gap_a (conv_id text PRIMARY KEY);"});
    later.push_back({top + 7, std::to_string(top + 7) + "_gap_b",
                     "ALTER TABLE gap_a ADD COLUMN note text; INSERT INTO gap_a SELECT conv_id, 'kept' FROM conversations;"});
    for (const auto& m : later) {
        s.migrations.push_back(m);
        EXPECT_EQ(im::migrate(c, s).migrations, 1) << m.name;
        EXPECT_EQ(pg.scalar("SELECT checksum FROM schema_migrations WHERE version = " + std::to_string(m.version)),
                  im::schema_checksum(m.sql));
    }
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM events"), "3");
    EXPECT_EQ(pg.scalar("SELECT body FROM events WHERE client_msg_id = 'k1'"), "hello");
    EXPECT_EQ(pg.scalar("SELECT read FROM read_markers"), "3");
    EXPECT_EQ(pg.scalar("SELECT note FROM gap_a"), "kept");
    // The functions, then a send through them on the old rows.
    s.functions = im::all_functions();
    s.function_version = im::embedded_schema().function_version;
    EXPECT_EQ(im::migrate(c, s).functions, static_cast<int>(s.functions.size()));
    pqxx::work tx(c);
    auto r = tx.exec("SELECT r_code, r_seq, r_dup FROM im_send('{d1}', '{01}', '{c1}', '{u1}', '{1,1}', '{k1,k2}', "
                     "'{hello,again}', '{NULL,NULL}', '{NULL,NULL}', '{NULL,NULL}', '')");
    ASSERT_EQ(r.size(), 2u);
    EXPECT_STREQ(r[0][0].c_str(), "IDEMPOTENCY_MISMATCH"); // the stored hash is a placeholder
    EXPECT_STREQ(r[1][0].c_str(), "OK");
    EXPECT_EQ(r[1][1].as<int>(), 4);
}

TEST(Schema, the_squashed_baseline_makes_the_same_tables_as_the_history_it_replaces) {
    TestPostgres pg;
    pqxx::connection c(pg.url());
    im::Schema baseline;
    baseline.migrations.push_back(im::all_migrations().front());
    im::migrate(c, baseline);
    // events_conv_mid_key (was migration 002): mid unique per conversation only.
    pqxx::work tx(c);
    tx.exec("INSERT INTO conversations (conv_id, kind) VALUES ('c1', 'group'), ('c2', 'group')");
    tx.exec("INSERT INTO events (conv_id, seq, mid, kind, epoch, msg_ordinal) VALUES "
            "('c1', 1, '00000000-0000-4000-8000-000000000001', 'msg', 1, 1), "
            "('c2', 1, '00000000-0000-4000-8000-000000000001', 'msg', 1, 1)");
    EXPECT_THROW(tx.exec("INSERT INTO events (conv_id, seq, mid, kind, epoch, msg_ordinal) VALUES "
                         "('c1', 2, '00000000-0000-4000-8000-000000000001', 'msg', 1, 2)"),
                 pqxx::unique_violation);
}

// schema/010: the row lock proves the conversation, and nothing reads by mid:
// the foreign key and the mid index are gone, the indexes that are read stay.
TEST(Schema, migration_010_drops_the_events_foreign_key_and_the_mid_index_and_keeps_the_read_ones) {
    TestPostgres pg;
    pqxx::connection c(pg.url());
    im::migrate(c);
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM pg_constraint WHERE conrelid = 'events'::regclass AND contype = 'f'"),
              "0");
    EXPECT_EQ(pg.scalar("SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes "
                        "WHERE tablename = 'events'"),
              "events_by_sender,events_idempotency,events_pkey,events_recall_target");
    // Other tables keep their keys to conversations.
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM pg_constraint WHERE conrelid = 'membership_periods'::regclass "
                        "AND contype = 'f' AND confrelid = 'conversations'::regclass"),
              "1");
}

// im_send's statements take the group's arrays as parameters; a custom plan
// sees them as constants and always looks cheaper than the generic one, so
// under the default plan_cache_mode the key lookup was replanned on most
// calls (docs/benchmarks.md, "Generic plans"). The function carries its own
// setting, so whatever an operator sets for the database, the send path plans
// once per connection.
TEST(Schema, im_send_plans_generically_whatever_the_database_sets) {
    TestPostgres pg;
    pg.scalar("ALTER DATABASE im SET plan_cache_mode = force_custom_plan");
    pqxx::connection c(pg.url());
    im::migrate(c);
    EXPECT_EQ(pg.scalar("SELECT array_to_string(proconfig, ',') FROM pg_proc "
                        "WHERE oid = 'im_send(text[], text[], text[], text[], integer[], text[], text[], text[], "
                        "bigint[], text[], text)'::regprocedure"),
              "plan_cache_mode=force_generic_plan");
}

// An operator's database defaults that the contract cannot run under
// (postgresql.conf, ALTER DATABASE or ALTER ROLE): the gateway pins its own
// sessions' values and says so once in its log (db_pool.cpp,
// pin_operator_settings; docs/operations.md, "Database settings the gateway
// pins"). Without it the gateway cannot migrate or provision (read-only), a
// body outside Latin-1 is stored as mojibake (the client reads it back
// intact, the row's length is 21 code points, not 9), a reply could precede
// the WAL flush, and a send may fail with a serialization error (the burst
// below did not show one in our runs: the log is what catches that pin).
// The other defaults set here change nothing the gateway answers.
TEST(OperatorSettings, the_contract_holds_whatever_the_databases_defaults_say) {
    TestPostgres pg;
    // (read-only last: this test's own later ALTERs would fail after it)
    for (const char* s : {"default_transaction_isolation = 'serializable'", "synchronous_commit = off",
                          "client_encoding = 'LATIN1'", "standard_conforming_strings = off",
                          "plan_cache_mode = force_custom_plan", "bytea_output = 'escape'",
                          "TimeZone = 'Pacific/Kiritimati'", "DateStyle = 'SQL, DMY'",
                          "IntervalStyle = 'sql_standard'", "extra_float_digits = -15",
                          "idle_session_timeout = '1s'", "default_transaction_read_only = on"})
        pg.scalar(std::string("ALTER DATABASE im SET ") + s);
    ServerProcess srv(pg.url());
    auto w = make_world(pg.url(), "opset", 3);
    const std::int64_t joins = 3;

    // Concurrent sends into one conversation from six connections: under
    // serializable, their transactions conflict (the same row, the same
    // index ranges).
    constexpr int per_conn = 10;
    std::vector<std::unique_ptr<WsClient>> conns;
    for (int i = 0; i < 6; ++i) conns.push_back(login(srv.port(), w.users[static_cast<std::size_t>(i % 3)]));
    std::vector<std::vector<json::object>> replies(conns.size());
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < conns.size(); ++i)
        threads.emplace_back([&, i] {
            for (int k = 0; k < per_conn; ++k)
                replies[i].push_back(send_msg(*conns[i], w.conv, "c" + std::to_string(i) + "-" + std::to_string(k),
                                              "burst " + std::to_string(k)));
        });
    for (auto& t : threads) t.join();
    std::set<std::int64_t> seqs;
    for (const auto& rs : replies)
        for (const auto& r : rs) {
            ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
            EXPECT_FALSE(r.at("dup").as_bool());
            seqs.insert(num(r, "seq"));
        }
    EXPECT_EQ(seqs.size(), conns.size() * per_conn);
    EXPECT_EQ(*seqs.begin(), joins + 1);
    EXPECT_EQ(*seqs.rbegin(), joins + static_cast<std::int64_t>(conns.size() * per_conn));

    // A body far outside Latin-1 is stored and read back as sent.
    const std::string body = "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xe2\x9c\x93 \xf0\x9f\x99\x82 \xc3\xa9";
    auto& a = *conns[0];
    auto sent = send_msg(a, w.conv, "uni", body);
    ASSERT_EQ(str(sent, "t"), "sent") << json::serialize(sent);
    auto page = sync_conv(*conns[1], w.conv, num(sent, "seq") - 1, 1);
    ASSERT_EQ(str(page, "t"), "page") << json::serialize(page);
    ASSERT_EQ(page.at("events").as_array().size(), 1u);
    const auto& ev = page.at("events").as_array()[0].as_object();
    EXPECT_EQ(str(ev, "body"), body);
    const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
    EXPECT_LT(std::llabs(num(ev, "ts") - now_ms), 60000) << "ts is epoch milliseconds whatever TimeZone says";
    EXPECT_EQ(pg.scalar("SELECT length(body) FROM events WHERE client_msg_id = 'uni'"), "9");

    // The request key: the same body again is the original; another is a mismatch.
    auto again = send_msg(a, w.conv, "uni", body);
    EXPECT_EQ(str(again, "t"), "sent");
    EXPECT_TRUE(again.at("dup").as_bool());
    EXPECT_EQ(num(again, "seq"), num(sent, "seq"));
    EXPECT_EQ(str(send_msg(a, w.conv, "uni", "other"), "code"), "IDEMPOTENCY_MISMATCH");
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM events WHERE kind = 'msg'"), std::to_string(conns.size() * per_conn + 1));

    // Said once per setting it overrode; the settings it may keep are kept.
    const std::string log = srv.log();
    for (const char* setting : {"client_encoding", "default_transaction_isolation", "default_transaction_read_only",
                                "standard_conforming_strings", "synchronous_commit", "idle_session_timeout"}) {
        const std::string mark = std::string("\"setting\":\"") + setting + "\"";
        EXPECT_NE(log.find(mark), std::string::npos) << setting << " not reported overridden:\n" << log;
        EXPECT_EQ(log.find(mark), log.rfind(mark)) << setting << " reported more than once";
    }
    EXPECT_EQ(log.find("\"setting\":\"TimeZone\""), std::string::npos);

    // The gateway's sessions idle by design: under the operator's
    // idle_session_timeout (1 s here) PostgreSQL would end them, the LISTEN
    // session with them (every subscriber told to resync). Still the same
    // backends after twice that long idle.
    const std::string backends = "SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity "
                                 "WHERE application_name LIKE 'imserver-%'";
    const std::string before = pg.scalar(backends);
    ASSERT_FALSE(before.empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(2500)); // the idleness itself is the condition
    EXPECT_EQ(pg.scalar(backends), before) << "the gateway's idle sessions were ended";
}

// A database in another encoding than UTF8 would refuse some bodies or store
// them altered: the gateway refuses it at start, before it changes anything,
// and says how to make one that works.
TEST(OperatorSettings, a_database_not_in_utf8_is_refused_before_anything_changes) {
    TestPostgres pg;
    pg.scalar("CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
    std::string error;
    try {
        ServerProcess srv(pg.url("latin"));
    } catch (const std::exception& e) {
        error = e.what();
    }
    EXPECT_NE(error.find("the database's encoding is LATIN1; imserver needs UTF8"), std::string::npos)
        << "the start was not refused as it should be: " << error;
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", "latin"), "0")
        << "a refused start created tables";
}

// The pin's effect, not its log line: an acknowledged send survives an
// immediate-mode stop of the database (no shutdown checkpoint, no WAL
// writer flush: what a crash of PostgreSQL leaves) even where the
// database's own default is synchronous_commit = off. Under `off` a COMMIT
// returns with its WAL still in PostgreSQL's buffers, and with the WAL
// writer's delay at its 10 s maximum the last page of it is still there
// when the database stops: the acknowledged sends on it are gone after the
// restart. Under the pinned `on` the WAL is written before the reply (the
// test clusters run with fsync off, so `on` writes to the OS, which an
// immediate stop keeps; a power cut is not what this tests).
TEST(OperatorSettings, an_acknowledged_send_survives_an_immediate_stop_of_a_database_whose_default_is_asynchronous_commit) {
    TestPostgres pg;
    pg.scalar("ALTER SYSTEM SET wal_writer_delay = '10s'");
    pg.scalar("SELECT pg_reload_conf()");
    pg.scalar("ALTER DATABASE im SET synchronous_commit = off");
    ServerProcess srv(pg.url(), {"--quiet"});
    auto w = make_world(pg.url(), "durable", 2);
    auto c = login(srv.port(), w.users[0]);
    std::set<std::int64_t> acked;
    for (int i = 0; i < 30; ++i) {
        auto r = send_msg(*c, w.conv, "durable-" + std::to_string(i), "acknowledged " + std::to_string(i));
        ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
        acked.insert(num(r, "seq"));
    }
    // At once, before the WAL writer's next round.
    pg.stop_immediate();
    pg.start();
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM events WHERE client_msg_id LIKE 'durable-%'"),
              std::to_string(acked.size()))
        << "acknowledged sends were lost by an immediate stop of the database";
    EXPECT_EQ(pg.scalar("SELECT max(seq) FROM events WHERE conv_id = " + q(w.conv)), std::to_string(*acked.rbegin()));
}

} // namespace

// Migration 018 fills the reactions summary (msg_changes.reactions_top) of
// the rows written before it, as im_change writes it: the top 20 counts
// above 0, most counted first, ties in the emoji's byte order; a msg that
// was only edited keeps none.
TEST(Schema, migration_018_fills_the_reactions_summary_of_existing_rows) {
    TestPostgres pg;
    pqxx::connection c(pg.url());
    im::Schema before = im::embedded_schema();
    const auto at = std::find_if(before.migrations.begin(), before.migrations.end(),
                                 [](const im::Migration& m) { return m.name == "018_reactions_top"; });
    ASSERT_NE(at, before.migrations.end());
    before.migrations.erase(at, before.migrations.end());
    im::migrate(c, before);
    ASSERT_EQ(pg.scalar("SELECT count(*) FROM information_schema.columns WHERE table_name = 'msg_changes' "
                        "AND column_name = 'reactions_top'"),
              "0");
    // Message 1: 24 emoji, "e00".."e23" counted 1..24 but "e10" 0 (all off)
    // and "b" and "a" 24 as "e23" (ties: "a" < "b" < "e23"); message 2
    // edited only.
    pg.scalar("INSERT INTO reaction_counts (conv_id, target_seq, emoji, count) "
              "SELECT 'c', 1, 'e' || lpad(i::text, 2, '0'), CASE WHEN i = 10 THEN 0 ELSE i + 1 END "
              "FROM generate_series(0, 23) i UNION ALL VALUES ('c', 1, 'b', 24), ('c', 1, 'a', 24)");
    pg.scalar("INSERT INTO msg_changes (conv_id, seq, edit_seq, edit_body, edit_at, reactions_seq) "
              "VALUES ('c', 1, NULL, NULL, NULL, 30), ('c', 2, 31, 'edited', now(), NULL)");
    im::migrate(c);
    const std::string want =
        R"([["a", 24], ["b", 24], ["e23", 24], ["e22", 23], ["e21", 22], ["e20", 21], ["e19", 20], ["e18", 19], )"
        R"(["e17", 18], ["e16", 17], ["e15", 16], ["e14", 15], ["e13", 14], ["e12", 13], ["e11", 12], ["e09", 10], )"
        R"(["e08", 9], ["e07", 8], ["e06", 7], ["e05", 6]])";
    EXPECT_EQ(pg.scalar("SELECT reactions_top::jsonb::text FROM msg_changes WHERE conv_id = 'c' AND seq = 1"), want);
    EXPECT_EQ(pg.scalar("SELECT coalesce(reactions_top, 'none') FROM msg_changes WHERE conv_id = 'c' AND seq = 2"),
              "none");
}

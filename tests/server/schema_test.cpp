// The schema on a real PostgreSQL: the rules a distributed PostgreSQL
// (events and their companions spread by conversation) puts on it, read from
// the catalog after the real migrations ran. See docs/scaling.md.
#include "harness.hpp"

#include "migrations.hpp"

#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include <set>
#include <string>

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
    for (const char* i : {"events_pkey", "events_conv_mid_key", "events_idempotency", "events_recall_target",
                          "membership_open_period", "idem_tombstones_pkey"})
        EXPECT_TRUE(checked.count(i)) << i << " was not seen";
}

TEST(Schema, a_database_at_001_with_events_upgrades_and_mid_is_unique_per_conversation) {
    TestPostgres pg;
    pqxx::connection c(pg.url());
    const auto& all = im::all_migrations();
    ASSERT_GE(all.size(), 2u);
    ASSERT_EQ(all[1].version, 2);
    {
        // A database as release 001 left it, with rows.
        pqxx::work tx(c);
        tx.exec("CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())");
        tx.exec(all[0].sql);
        tx.exec_params("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", all[0].version, all[0].name);
        tx.exec("INSERT INTO conversations (conv_id, kind) VALUES ('c1', 'group'), ('c2', 'group')");
        tx.exec("INSERT INTO events (conv_id, seq, mid, kind, epoch, msg_ordinal) VALUES "
                "('c1', 1, '00000000-0000-4000-8000-000000000001', 'msg', 1, 1)");
        tx.commit();
    }
    EXPECT_GE(im::migrate(c), 1);
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM events"), "1");
    EXPECT_EQ(pg.scalar("SELECT max(version) FROM schema_migrations"), std::to_string(all.back().version));

    // Same mid in another conversation: allowed now (a shard cannot see the others).
    {
        pqxx::work tx(c);
        tx.exec("INSERT INTO events (conv_id, seq, mid, kind, epoch, msg_ordinal) VALUES "
                "('c2', 1, '00000000-0000-4000-8000-000000000001', 'msg', 1, 1)");
        tx.commit();
    }
    // Same mid twice in one conversation: still refused by the database.
    pqxx::work tx(c);
    EXPECT_THROW(tx.exec("INSERT INTO events (conv_id, seq, mid, kind, epoch, msg_ordinal) VALUES "
                         "('c1', 2, '00000000-0000-4000-8000-000000000001', 'msg', 1, 2)"),
                 pqxx::unique_violation);
}

} // namespace

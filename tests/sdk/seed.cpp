// im_sdk_seed: puts large data sets into a running imserver's database for
// the SDK tests and benchmarks (what no client could make quickly):
//   im_sdk_seed DBURL convs USER PREFIX N     N group conversations with USER
//                                             as the only member (a join each)
//   im_sdk_seed DBURL events CONV SENDER N    N msg events from SENDER, appended
//                                             as the server would number them
//   im_sdk_seed DBURL group CONV PREFIX N U... a group conversation with members
//                                             U... and N new users PREFIX-i
//   im_sdk_seed DBURL rewind CONV SEQ         CONV as a restore from a backup
//                                             taken at SEQ leaves it: events,
//                                             keys, markers and periods above
//                                             SEQ gone, next_seq = SEQ + 1
// Conversations go through the server's own Store (join events, periods);
// events are one INSERT ... SELECT generate_series (seq, epoch and the running
// ordinals that `unread` uses filled as append_event fills them).
#include "core/faults.hpp"
#include "store/store.hpp"

#include <pqxx/pqxx>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

int main(int argc, char **argv) {
    try {
        if (argc == 6 && std::string(argv[2]) == "convs") {
            pqxx::connection conn(argv[1]);
            im::FaultRegistry faults(false);
            im::Store store(faults, {});
            const int n = std::stoi(argv[5]);
            for (int i = 0; i < n; ++i)
                store.create_conv(conn, std::string(argv[4]) + "-" + std::to_string(100000 + i), "group", {argv[3]});
            std::printf("%d\n", n);
            return 0;
        }
        if (argc == 6 && std::string(argv[2]) == "events") {
            pqxx::connection conn(argv[1]);
            pqxx::work tx(conn);
            const long long n = std::stoll(argv[5]);
            tx.exec_params(
                "WITH c AS (SELECT next_seq, msg_count, epoch FROM conversations WHERE conv_id = $1 FOR UPDATE),"
                " s AS (SELECT COALESCE((SELECT sender_ordinal FROM events WHERE conv_id = $1 AND sender_user = $2"
                "       AND kind = 'msg' ORDER BY seq DESC LIMIT 1), 0) AS so)"
                " INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, body, epoch, msg_ordinal,"
                "  sender_ordinal)"
                " SELECT $1, c.next_seq + g, 'msg', $2, 'seed-' || (c.next_seq + g), 'message ' || (c.next_seq + g),"
                "  c.epoch, c.msg_count + g + 1, s.so + g + 1 FROM c, s, generate_series(0, $3::bigint - 1) g",
                argv[3], argv[4], n);
            auto r = tx.exec_params("UPDATE conversations SET next_seq = next_seq + $2, msg_count = msg_count + $2"
                                    " WHERE conv_id = $1 RETURNING next_seq - 1",
                                    argv[3], n);
            tx.commit();
            pqxx::nontransaction(conn).exec("ANALYZE events");
            std::printf("%s\n", r.empty() ? "0" : r[0][0].c_str());
            return r.empty() ? 1 : 0;
        }
        if (argc >= 6 && std::string(argv[2]) == "group") {
            pqxx::connection conn(argv[1]);
            std::vector<std::string> members(argv + 6, argv + argc);
            {
                pqxx::work tx(conn);
                for (int i = 0, n = std::stoi(argv[5]); i < n; ++i) {
                    members.push_back(std::string(argv[4]) + "-" + std::to_string(i));
                    tx.exec_params("INSERT INTO users (user_id) VALUES ($1) ON CONFLICT DO NOTHING", members.back());
                }
                tx.commit();
            }
            im::FaultRegistry faults(false);
            im::Store store(faults, {});
            store.create_conv(conn, argv[3], "group", members);
            std::printf("%zu\n", members.size());
            return 0;
        }
        if (argc == 5 && std::string(argv[2]) == "rewind") {
            // What a database restored from a backup taken when CONV's head
            // was SEQ holds for CONV (request keys live on the event rows).
            pqxx::connection conn(argv[1]);
            pqxx::work tx(conn);
            const long long seq = std::stoll(argv[4]);
            tx.exec_params("SELECT 1 FROM conversations WHERE conv_id = $1 FOR UPDATE", argv[3]);
            tx.exec_params("DELETE FROM events WHERE conv_id = $1 AND seq > $2", argv[3], seq);
            tx.exec_params("UPDATE conversations SET next_seq = $2 + 1, msg_count = COALESCE((SELECT MAX(msg_ordinal)"
                           " FROM events WHERE conv_id = $1), 0) WHERE conv_id = $1",
                           argv[3], seq);
            tx.exec_params("UPDATE delivery_markers SET delivered = LEAST(delivered, $2) WHERE conv_id = $1", argv[3], seq);
            tx.exec_params("UPDATE read_markers SET read = LEAST(read, $2) WHERE conv_id = $1", argv[3], seq);
            tx.exec_params("DELETE FROM membership_periods WHERE conv_id = $1 AND from_seq > $2", argv[3], seq);
            tx.exec_params("UPDATE membership_periods SET to_seq = NULL WHERE conv_id = $1 AND to_seq > $2", argv[3], seq);
            tx.commit();
            std::printf("%lld\n", seq);
            return 0;
        }
        std::fprintf(stderr, "usage: im_sdk_seed DBURL (convs USER PREFIX N | events CONV SENDER N"
                             " | group CONV PREFIX N USER... | rewind CONV SEQ)\n");
        return 2;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "im_sdk_seed: %s\n", e.what());
        return 1;
    }
}

// im_sdk_seed: puts large data sets into a running imserver's database for
// the SDK tests and benchmarks (what no client could make quickly):
//   im_sdk_seed DBURL convs USER PREFIX N     N group conversations with USER
//                                             as the only member (a join each)
//   im_sdk_seed DBURL events CONV SENDER N    N msg events from SENDER, appended
//                                             as the server would number them
// Conversations go through the server's own Store (join events, periods);
// events are one INSERT ... SELECT generate_series (seq, epoch and the running
// ordinals that `unread` uses filled as append_event fills them).
#include "core/faults.hpp"
#include "store/store.hpp"

#include <pqxx/pqxx>

#include <cstdio>
#include <exception>
#include <string>

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
        std::fprintf(stderr, "usage: im_sdk_seed DBURL (convs USER PREFIX N | events CONV SENDER N)\n");
        return 2;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "im_sdk_seed: %s\n", e.what());
        return 1;
    }
}

// imserver: a gateway of the chat contract, or (`imserver admin ...`) the
// operator CLI. Thin: parsing options and wiring the layers together.
#include "app/admin.hpp"
#include "net/backend_api.hpp"
#include "core/config.hpp"
#include "store/database.hpp"
#include "store/db_pool.hpp"
#include "core/log.hpp"
#include "core/metrics.hpp"
#include "store/migrations.hpp"
#include "store/lab_schema.hpp"
#include "net/gateway.hpp"
#include "net/notifier.hpp"
#include "bus/nats_bus.hpp"
#include "bus/pg_bus.hpp"
#include "store/store.hpp"

#include <pqxx/pqxx>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <chrono>
#include <optional>
#include <thread>

namespace {

void write_ready_file(const std::string& path, unsigned short port) {
    std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::trunc);
        f << port << '\n';
    }
    std::filesystem::rename(tmp, path);
}

int serve(const im::Config& cfg) {
    // A log reader that went away (stderr a pipe: a supervisor restarted,
    // `imserver 2>&1 | head`) must not end the gateway and every connection
    // on it: with SIGPIPE ignored a write to that pipe fails with EPIPE
    // instead. Sockets never raise it (Asio and libpq send with
    // MSG_NOSIGNAL); the embedded cluster's programs get the default back
    // (pg_cluster.cpp, spawn).
    std::signal(SIGPIPE, SIG_IGN);
    im::set_log_gateway(cfg.gateway_id);
    im::set_log_quiet(cfg.quiet);
    // The signed-token keys first: a bad key file stops the start at once.
    std::unique_ptr<im::jwt::Verifier> jwt;
    if (cfg.jwt_enabled()) {
        jwt = std::make_unique<im::jwt::Verifier>(cfg.jwt_hs256_secret_file, cfg.jwt_jwks,
                                                  im::jwt::Settings{cfg.jwt_issuer, cfg.jwt_audience});
        if (auto e = jwt->reload()) {
            std::cerr << "imserver: " << *e << '\n';
            return 1;
        }
    }
    im::Database db = im::open_database(im::db_conninfo(cfg), cfg.state_dir);
    struct StopCluster {
        im::Database& d;
        ~StopCluster() {
            // The embedded cluster lives and dies with the gateway.
            if (d.cluster) {
                d.cluster->stop();
                im::log_info("embedded_pg_stopped");
            }
        }
    } stopper{db};
    // The start's own connections wait (im::start_wait each) for a database
    // that is starting, or slow to take a connection on a loaded machine.
    int applied = 0;
    try {
        applied = im::prepare_schema(db.url);
    } catch (const im::SchemaMismatch& e) {
        // An applied migration was edited (or the database's history is
        // another schema's): nothing is altered, the start stops.
        im::log_error("schema_migration_changed", {{"version", e.version}, {"recorded", e.recorded_name},
                                                   {"file", e.file_name}, {"recorded_checksum", e.recorded_checksum},
                                                   {"file_checksum", e.file_checksum}});
        std::cerr << "imserver: " << e.what() << '\n';
        return 1;
    }
    if (auto refusal = im::refuse_foreign_lab_database(db.url, applied, cfg)) {
        std::cerr << "imserver: " << *refusal << '\n';
        return 2;
    }

    if (cfg.enable_faults) {
        // The lab's broken send functions, only into a database the lab
        // created (checked by the marker): production SQL has no lab switch.
        auto c = im::open_connection_waiting(db.url, "imserver-lab");
        if (im::Store::lab_database(*c, false)) im::install_lab_send_functions(*c);
        else im::log_warn("lab_send_functions_not_installed", {{"reason", "not a database the lab created"}});
    }
    if (cfg.lab.no_unique_index) {
        // The switch drops an index: only on a database a lab run created
        // (checked above).
        auto c = im::open_connection_waiting(db.url, "imserver-lab");
        im::Store::lab_drop_unique_index(*c);
        im::log_warn("lab_control_no_unique_index");
    } else {
        auto c = im::open_connection_waiting(db.url, "imserver-check");
        im::FaultRegistry none(false);
        if (!im::Store(none, {}).idempotency_index_present(*c)) {
            im::log_error("idempotency_index_missing");
            std::cerr << "imserver: the unique index events_idempotency is missing, so resends could be stored "
                         "twice; recreate it (see docs/operations.md) before starting\n";
            return 1;
        }
    }
    if (cfg.lab.purge_without_tombstones) im::log_warn("lab_control_purge_without_tombstones");

    im::FaultRegistry faults(cfg.enable_faults);
    for (const auto& f : cfg.faults) {
        if (auto e = faults.arm(f)) {
            std::cerr << "imserver: --fault " << f << ": " << *e << '\n';
            return 2;
        }
    }
    if (cfg.enable_faults) im::log_warn("faults_enabled");

    im::Store store(faults, cfg.lab);
    // The PostgreSQL bus: sends announce their events with their COMMIT
    // (one transaction per reply); NATS publishes after it (bus.hpp).
    if (cfg.bus == "postgres" && cfg.notify_in_commit) store.notify_in_commit(im::notify_channel);
    im::Metrics metrics;
    im::DbPool pool(db.url, static_cast<std::size_t>(cfg.db_pool), im::effective_db_queue(cfg),
                    std::chrono::milliseconds(cfg.db_timeout_ms));
    boost::asio::io_context ioc(cfg.io_threads);
    std::unique_ptr<im::NotificationBus> bus_owner;
    if (cfg.bus == "postgres") bus_owner = std::make_unique<im::PgBus>(db.url, cfg.gateway_id, metrics, cfg.listen_probe_ms,
                                                                    cfg.db_timeout_ms);
    else bus_owner = std::make_unique<im::NatsBus>(cfg.bus, cfg.gateway_id, metrics);
    im::NotificationBus& bus = *bus_owner;
    im::log_info("bus", {{"bus", cfg.bus == "postgres" ? std::string("postgres") : std::string("nats")}});
    auto gw = std::make_shared<im::Gateway>(ioc, cfg, pool, store, metrics, faults, std::move(jwt));
    gw->api().bus = &bus;
    im::Notifier notifier(db.url, gw, store, metrics);
    gw->api().committed = [&notifier](const std::vector<im::Event>& events) { notifier.committed_here(events); };
    notifier.start(bus);
    unsigned short port = gw->listen();
    if (auto mp = gw->listen_metrics())
        im::log_info("metrics_listening", {{"listen", cfg.metrics_listen}, {"port", static_cast<int>(*mp)}});
    // The backend API on its own listener (never the WebSocket port).
    im::BackendApi api(*gw);
    std::optional<unsigned short> api_port;
    if (!cfg.api_listen.empty()) {
        try {
            api_port = api.listen(ioc, gw);
        } catch (const std::exception& e) {
            // The default address taken (a second gateway on this host):
            // this one runs without the API. An address asked for must work.
            auto origin = cfg.origin.find("api-listen");
            if (origin != cfg.origin.end() && origin->second != "default") throw;
            im::log_warn("api_not_listening", {{"listen", cfg.api_listen}, {"err", e.what()}});
        }
    }

    // SIGHUP: reload the TLS certificate and key (open connections keep
    // theirs) and the JWT keys.
    boost::asio::signal_set hup(ioc, SIGHUP);
    std::function<void()> wait_hup = [&] {
        hup.async_wait([&](const boost::system::error_code& ec, int) {
            if (ec) return;
            gw->reload_on_hup();
            wait_hup();
        });
    };
    wait_hup();

    boost::asio::signal_set signals(ioc, SIGTERM, SIGINT);
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        im::log_info("signal", {{"signal", sig}});
        hup.cancel();
        api.close();
        gw->drain([&ioc] { ioc.stop(); });
    });

    im::log_info("listening", {{"host", cfg.listen_host}, {"port", static_cast<int>(port)}, {"tls", gw->tls() ? "on" : "off"}});
    if (api_port) {
        auto colon = cfg.api_listen.rfind(':');
        im::log_info("api_listening", {{"host", cfg.api_listen.substr(0, colon)},
                                       {"port", static_cast<int>(*api_port)},
                                       {"tls", gw->tls() ? "on" : "off"}});
        if (!cfg.api_ready_file.empty()) write_ready_file(cfg.api_ready_file, *api_port);
    }
    if (!cfg.ready_file.empty()) write_ready_file(cfg.ready_file, port);

    std::vector<std::thread> threads;
    for (int i = 1; i < cfg.io_threads; ++i) threads.emplace_back([&ioc] { ioc.run(); });
    ioc.run();
    for (auto& t : threads) t.join();
    gw->release_listener();
    api.release_listener();

    pool.stop(); // in-flight requests still publish
    bus.stop();
    im::log_info("stopped");
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "admin") == 0) return im::admin_main(argc - 1, argv + 1);
    im::Config cfg;
    im::ConfigAction action = im::ConfigAction::run;
    if (auto e = im::parse_config(argc, argv, cfg, action)) {
        std::cerr << "imserver: " << *e << '\n';
        return 2;
    }
    if (action == im::ConfigAction::help) {
        std::cout << im::config_help();
        return 0;
    }
    if (action == im::ConfigAction::print_config) {
        std::cout << im::print_config(cfg);
        return 0;
    }
    try {
        return serve(cfg);
    } catch (const std::exception& e) {
        im::log_error("fatal", {{"err", e.what()}});
        std::cerr << "imserver: " << e.what() << '\n';
        return 1;
    }
}

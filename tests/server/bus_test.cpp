// The notification bus's pure parts: the --bus flag and the NATS bus's
// message packing. The buses themselves run in the scale-out lab
// (tests/scaleout: bus-postgres, bus-nats) against real engines.
#include "core/config.hpp"
#include "bus/nats_bus.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

std::optional<std::string> parse(std::vector<std::string> args, im::Config& cfg) {
    args.insert(args.begin(), "--config=");  // no configuration file: flags only
    im::ConfigAction action = im::ConfigAction::run;
    return im::parse_config(args, cfg, im::ConfigScope::gateway, action);
}

TEST(Bus, flag_takes_postgres_or_nats_urls_and_names_what_it_expects_otherwise) {
    im::Config cfg;
    EXPECT_EQ(cfg.bus, "postgres");
    EXPECT_FALSE(parse({"--bus", "nats://127.0.0.1:4222"}, cfg));
    EXPECT_EQ(cfg.bus, "nats://127.0.0.1:4222");
    EXPECT_FALSE(parse({"--bus", "nats://a:4222,nats://b:4223"}, cfg));
    EXPECT_EQ(cfg.bus, "nats://a:4222,nats://b:4223");
    EXPECT_FALSE(parse({"--bus", "postgres"}, cfg));
    EXPECT_EQ(cfg.bus, "postgres");
    for (const char* bad : {"kafka://x:1", "nats://", "nats://host", "nats://host:0", "nats://host:99999",
                            "nats://a:1,redis://b:2", "nats://a:1,", "nats://a:1,,nats://b:2",
                            "nats://a:1, nats://b:2", ""}) {
        im::Config c;
        auto e = parse({"--bus", bad}, c);
        ASSERT_TRUE(e) << bad;
        EXPECT_NE(e->find("--bus"), std::string::npos) << *e;
        EXPECT_EQ(c.bus, "postgres") << "a refused value changes nothing";
    }
}

TEST(Bus, a_nats_url_list_becomes_one_server_per_url_for_the_client_library) {
    using V = std::vector<std::string>;
    EXPECT_EQ(im::nats_servers("nats://127.0.0.1:4222"), V{"nats://127.0.0.1:4222"});
    EXPECT_EQ(im::nats_servers("nats://a:4222,nats://b:4223,nats://c:4224"),
              (V{"nats://a:4222", "nats://b:4223", "nats://c:4224"}));
    // Empty items stay, so that --bus refuses them (above) instead of the
    // bus quietly dropping a server the operator meant to list.
    EXPECT_EQ(im::nats_servers("nats://a:1,"), (V{"nats://a:1", ""}));
    EXPECT_EQ(im::nats_servers(""), V{""});
}

TEST(Bus, nats_messages_carry_every_payload_once_in_order_within_the_size_limit) {
    std::vector<std::string> payloads;
    for (int i = 0; i < 1000; ++i) payloads.push_back("e conv-" + std::to_string(i) + " " + std::to_string(i * 7));
    payloads.push_back("x conv-3");
    auto msgs = im::NatsBus::pack(payloads, 1024);
    EXPECT_GT(msgs.size(), 10u);
    std::vector<std::string> back;
    for (const auto& m : msgs) {
        EXPECT_LE(m.size(), 1024u);
        auto part = im::NatsBus::unpack(m.data(), m.size());
        back.insert(back.end(), part.begin(), part.end());
    }
    EXPECT_EQ(back, payloads);
    EXPECT_TRUE(im::NatsBus::unpack("", 0).empty());
}

} // namespace

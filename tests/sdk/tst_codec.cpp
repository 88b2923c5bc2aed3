// The wire codec, tested from tables of frames (no sockets, no database).
#include "codec_p.h"
#include "shared_p.h"

#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtTest/QtTest>

using namespace im::proto;

class TestCodec : public QObject {
    Q_OBJECT
private slots:
    void decodes_every_server_frame_type_data();
    void decodes_every_server_frame_type();
    void rejects_malformed_frames_data();
    void rejects_malformed_frames();
    void page_fields_are_decoded_exactly();
    void a_msg_carries_its_later_changes();
    void typing_and_presence_fields_are_decoded_exactly();
    void encodes_requests_as_the_contract_spells_them_data();
    void encodes_requests_as_the_contract_spells_them();
    void only_unavailable_and_no_reply_are_retryable_data();
    void only_unavailable_and_no_reply_are_retryable();
    void reads_exp_from_a_jwt_and_nothing_from_other_tokens();
    void retry_backoff_doubles_to_its_cap_with_jitter_over_the_upper_half();
};

void TestCodec::decodes_every_server_frame_type_data() {
    QTest::addColumn<QByteArray>("frame");
    QTest::addColumn<int>("index"); // variant index in Body
    QTest::addColumn<QString>("rid");
    QTest::newRow("welcome") << QByteArray(R"({"t":"welcome","rid":"h1","user":"ana","device":"ana-d1","gateway":"gw-1","server_time":1732870000123})") << 0 << "h1";
    QTest::newRow("sent") << QByteArray(R"({"t":"sent","rid":"r2","conv":"c","seq":3,"mid":"m","dup":false,"epoch":1})") << 1 << "r2";
    QTest::newRow("page") << QByteArray(R"({"t":"page","rid":"r3","conv":"c","events":[],"next_after":0,"has_more":false,"head":0,"min_seq":1,"trimmed":false,"epoch":1})") << 2 << "r3";
    QTest::newRow("acked") << QByteArray(R"({"t":"acked","rid":"r4","conv":"c","delivered":5})") << 3 << "r4";
    QTest::newRow("read_ok") << QByteArray(R"({"t":"read_ok","rid":"r5","conv":"c","read":5})") << 4 << "r5";
    QTest::newRow("recalled") << QByteArray(R"({"t":"recalled","rid":"r6","conv":"c","seq":9,"dup":true})") << 5 << "r6";
    QTest::newRow("convs") << QByteArray(R"({"t":"convs","rid":"r7","convs":[{"conv":"c","kind":"group","head":4,"delivered":2,"read":1,"unread":3,"epoch":1,"min_seq":1}]})") << 6 << "r7";
    QTest::newRow("fetched") << QByteArray(R"({"t":"fetched","rid":"r8","ev":{"conv":"c","seq":3,"mid":"m","kind":"msg","sender":"ana","body":"hi","ts":1,"epoch":1}})") << 7 << "r8";
    QTest::newRow("subscribed") << QByteArray(R"({"t":"subscribed","rid":"r9"})") << 8 << "r9";
    QTest::newRow("event push") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":3,"mid":"m","kind":"msg","sender":"ana","body":"hi","ts":1,"epoch":1}})") << 9 << "";
    QTest::newRow("hint") << QByteArray(R"({"t":"hint","conv":"c","head":7,"epoch":1,"read":5})") << 10 << "";
    QTest::newRow("resync") << QByteArray(R"({"t":"resync"})") << 11 << "";
    QTest::newRow("goaway") << QByteArray(R"({"t":"goaway","reason":"shutdown","retry_ms":100})") << 12 << "";
    QTest::newRow("error") << QByteArray(R"({"t":"error","code":"NOT_MEMBER","msg":"conversation not visible","rid":"r10"})") << 13 << "r10";
    QTest::newRow("recall event") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":4,"mid":"m","kind":"recall","sender":"ana","target":3,"ts":1,"epoch":1}})") << 9 << "";
    QTest::newRow("token_expiring push") << QByteArray(R"({"t":"token_expiring","exp":1732870060123})") << 14 << "";
    QTest::newRow("refreshed") << QByteArray(R"({"t":"refreshed","rid":"r11","exp":1732873600000})") << 15 << "r11";
    QTest::newRow("unknown type (a newer server's push)") << QByteArray(R"({"t":"call_ring","conv":"c"})") << 16 << "";
    QTest::newRow("history window") << QByteArray(R"({"t":"page","rid":"r2","conv":"c","events":[{"conv":"c","seq":7,"kind":"msg","epoch":1}],"oldest":7,"has_older":true,"head":9,"min_seq":1,"trimmed":false,"epoch":1})") << 2 << "r2";
    QTest::newRow("convs page") << QByteArray(R"({"t":"convs","rid":"r3","convs":[{"conv":"a","kind":"group","head":3,"epoch":1}],"next_after":"a","has_more":true})") << 6 << "r3";
    QTest::newRow("join event") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":1,"mid":"m","kind":"join","user":"cy","ts":1,"epoch":1}})") << 9 << "";
    // Contract section 12.
    QTest::newRow("edited") << QByteArray(R"({"t":"edited","conv":"c","seq":10,"dup":false,"epoch":1,"rid":"e1"})") << 17 << "e1";
    QTest::newRow("reacted") << QByteArray(R"({"t":"reacted","conv":"c","seq":11,"dup":false,"changed":true,"epoch":1,"rid":"x1"})") << 18 << "x1";
    QTest::newRow("reacted, nothing to undo") << QByteArray(R"({"t":"reacted","conv":"c","seq":null,"dup":false,"changed":false,"epoch":1,"rid":"x3"})") << 18 << "x3";
    QTest::newRow("edit event") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":10,"mid":"m","kind":"edit","sender":"ben","body":"yes!","target":9,"cmid":"k","ts":1,"epoch":1}})") << 9 << "";
    QTest::newRow("reaction event") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":11,"mid":"m","kind":"reaction","sender":"ana","target":9,"emoji":"\ud83d\udc4d","on":true,"ts":1,"epoch":1}})") << 9 << "";
    // Contract section 13.
    QTest::newRow("typing_ok") << QByteArray(R"({"t":"typing_ok","rid":"t1"})") << 19 << "t1";
    QTest::newRow("typing push") << QByteArray(R"({"t":"typing","conv":"team","user":"ana","on":true})") << 20 << "";
    QTest::newRow("presence reply") << QByteArray(R"({"t":"presence","users":[{"user":"ben","online":true,"last_seen":1765080000123},{"user":"cy","online":false,"last_seen":null}],"rid":"p1"})") << 21 << "p1";
    QTest::newRow("presence reply, nobody visible") << QByteArray(R"({"t":"presence","users":[],"rid":"p2"})") << 21 << "p2";
    QTest::newRow("presence push") << QByteArray(R"({"t":"presence","user":"ben","online":false,"last_seen":1765080100789})") << 22 << "";
}

void TestCodec::decodes_every_server_frame_type() {
    QFETCH(QByteArray, frame);
    QFETCH(int, index);
    QFETCH(QString, rid);
    QString error;
    const std::optional<Incoming> in = decode(frame, &error);
    QVERIFY2(in.has_value(), qPrintable(error));
    QCOMPARE(int(in->body.index()), index);
    QCOMPARE(in->rid, rid);
}

void TestCodec::rejects_malformed_frames_data() {
    QTest::addColumn<QByteArray>("frame");
    QTest::addColumn<QString>("rid");
    QTest::newRow("not json") << QByteArray("hello") << "";
    QTest::newRow("array") << QByteArray("[1,2]") << "";
    QTest::newRow("no t") << QByteArray(R"({"rid":"x"})") << "x";
    QTest::newRow("t not string") << QByteArray(R"({"t":5})") << "";
    QTest::newRow("sent seq fractional") << QByteArray(R"({"t":"sent","rid":"r","conv":"c","seq":1.5,"mid":"m","dup":false})") << "r";
    QTest::newRow("sent seq string") << QByteArray(R"({"t":"sent","rid":"r","conv":"c","seq":"1","mid":"m"})") << "r";
    QTest::newRow("page missing next_after") << QByteArray(R"({"t":"page","rid":"r","conv":"c","events":[],"has_more":false,"head":0,"epoch":1})") << "r";
    QTest::newRow("page events out of order") << QByteArray(R"({"t":"page","rid":"r","conv":"c","events":[{"conv":"c","seq":2,"kind":"msg"},{"conv":"c","seq":1,"kind":"msg"}],"next_after":2,"has_more":false,"head":2,"epoch":1})") << "r";
    QTest::newRow("page event of other conv") << QByteArray(R"({"t":"page","rid":"r","conv":"c","events":[{"conv":"d","seq":1,"kind":"msg"}],"next_after":1,"has_more":false,"head":1,"epoch":1})") << "r";
    QTest::newRow("page next_after below events") << QByteArray(R"({"t":"page","rid":"r","conv":"c","events":[{"conv":"c","seq":3,"kind":"msg"}],"next_after":2,"has_more":false,"head":3,"epoch":1})") << "r";
    QTest::newRow("token_expiring without exp") << QByteArray(R"({"t":"token_expiring"})") << "";
    QTest::newRow("refreshed exp string") << QByteArray(R"({"t":"refreshed","rid":"r","exp":"1"})") << "r";
    QTest::newRow("recall without target") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":4,"kind":"recall","epoch":1}})") << "";
    QTest::newRow("event seq zero") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":0,"kind":"msg","epoch":1}})") << "";
    QTest::newRow("history window above its head") << QByteArray(R"({"t":"page","rid":"r","conv":"c","events":[{"conv":"c","seq":7,"kind":"msg","epoch":1}],"oldest":7,"has_older":false,"head":6,"epoch":1})") << "r";
    QTest::newRow("convs has_more without next_after") << QByteArray(R"({"t":"convs","rid":"r","convs":[{"conv":"a","head":3,"epoch":1}],"has_more":true})") << "r";
    QTest::newRow("error without code") << QByteArray(R"({"t":"error","rid":"r"})") << "r";
    QTest::newRow("reaction without emoji") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":4,"kind":"reaction","target":3,"on":true,"epoch":1}})") << "";
    QTest::newRow("reaction on not a bool") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":4,"kind":"reaction","target":3,"emoji":"x","on":1,"epoch":1}})") << "";
    QTest::newRow("edit without target") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":4,"kind":"edit","body":"b","epoch":1}})") << "";
    QTest::newRow("msg edit not above it") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":4,"kind":"msg","edit":{"seq":4,"body":"b"},"epoch":1}})") << "";
    QTest::newRow("msg reaction count 0") << QByteArray(R"({"t":"event","ev":{"conv":"c","seq":4,"kind":"msg","reactions":[{"emoji":"x","count":0,"me":false}],"epoch":1}})") << "";
    QTest::newRow("typing push without user") << QByteArray(R"({"t":"typing","conv":"c","on":true})") << "";
    QTest::newRow("typing push on not a bool") << QByteArray(R"({"t":"typing","conv":"c","user":"ana","on":1})") << "";
    QTest::newRow("presence push without online") << QByteArray(R"({"t":"presence","user":"ben","last_seen":5})") << "";
    QTest::newRow("presence reply element not an object") << QByteArray(R"({"t":"presence","rid":"p","users":["ben"]})") << "p";
    QTest::newRow("presence reply last_seen string") << QByteArray(R"({"t":"presence","rid":"p","users":[{"user":"ben","online":false,"last_seen":"5"}]})") << "p";
    QTest::newRow("reacted without changed") << QByteArray(R"({"t":"reacted","rid":"r","conv":"c","seq":3})") << "r";
}

void TestCodec::rejects_malformed_frames() {
    QFETCH(QByteArray, frame);
    QFETCH(QString, rid);
    QString error, gotRid;
    QVERIFY(!decode(frame, &error, &gotRid).has_value());
    QVERIFY(!error.isEmpty());
    QCOMPARE(gotRid, rid);
}

void TestCodec::page_fields_are_decoded_exactly() {
    const QByteArray frame = R"({"t":"page","rid":"r1","conv":"team","events":[
        {"conv":"team","seq":5,"mid":"m5","kind":"msg","sender":"ana","body":"hi","ts":100,"epoch":2},
        {"conv":"team","seq":7,"mid":"m7","kind":"recall","sender":"ana","target":5,"ts":101,"epoch":2}],
        "next_after":9,"has_more":true,"head":20,"min_seq":4,"trimmed":true,"epoch":2})";
    QString error;
    const auto in = decode(frame, &error);
    QVERIFY2(in, qPrintable(error));
    const Page &p = std::get<Page>(in->body);
    QCOMPARE(p.conv, QStringLiteral("team"));
    QCOMPARE(p.events.size(), 2);
    QCOMPARE(p.events[0], (Event{QStringLiteral("team"), 5, QStringLiteral("m5"), QStringLiteral("msg"),
                                 QStringLiteral("ana"), QStringLiteral("hi"), 100, 2, 0, QString(), QString()}));
    QCOMPARE(p.events[1].target, 5);
    QCOMPARE(p.nextAfter, 9);
    QVERIFY(p.hasMore);
    QCOMPARE(p.head, 20);
    QCOMPARE(p.minSeq, 4);
    QVERIFY(p.trimmed);
    QCOMPARE(p.epoch, 2);
}

void TestCodec::a_msg_carries_its_later_changes() {
    // docs/protocol.md's example of a msg with its changes (contract section 12).
    const QByteArray frame = R"({"t":"fetched","rid":"f","ev":{"conv":"ana-ben","seq":9,"mid":"m","kind":"msg","sender":"ben","body":"yes","reply_to":3,
        "edit":{"seq":10,"body":"yes!","ts":1732870001000},
        "reactions":[{"emoji":"a","count":2,"me":true},{"emoji":"b","count":1,"me":false}],
        "reactions_seq":12,"recalled":true,"cmid":"8c1f","ts":1732870000123,"epoch":1}})";
    QString error;
    const auto in = decode(frame, &error);
    QVERIFY2(in, qPrintable(error));
    const Event &e = std::get<Fetched>(in->body).ev;
    QCOMPARE(e.replyTo, 3);
    QCOMPARE(e.editSeq, 10);
    QCOMPARE(e.editBody, QStringLiteral("yes!"));
    QCOMPARE(e.editTs, 1732870001000);
    QCOMPARE(e.reactions, (QList<Reaction>{{QStringLiteral("a"), 2, true}, {QStringLiteral("b"), 1, false}}));
    QCOMPARE(e.reactionsSeq, 12);
    QVERIFY(e.recalled);
    const auto r = decode(R"({"t":"reacted","conv":"c","seq":null,"dup":false,"changed":false,"epoch":1,"rid":"x"})", &error);
    QVERIFY2(r, qPrintable(error));
    QCOMPARE(std::get<Reacted>(r->body).seq, 0);
    QVERIFY(!std::get<Reacted>(r->body).changed);
    // Client-side checks of an emoji (1-64 bytes of UTF-8, no control characters).
    QVERIFY(checkEmoji(QStringLiteral("\U0001F44D")).isEmpty());
    QVERIFY(checkEmoji(QString(64, u'a')).isEmpty());
    QVERIFY(!checkEmoji(QString(65, u'a')).isEmpty());
    QVERIFY(!checkEmoji(QString()).isEmpty());
    QVERIFY(!checkEmoji(QStringLiteral("a\tb")).isEmpty());
    QVERIFY(!checkEmoji(QString(QChar(0x85))).isEmpty());
}

void TestCodec::typing_and_presence_fields_are_decoded_exactly() {
    // docs/protocol.md's examples (contract section 13).
    QString error;
    auto in = decode(R"({"t":"typing","conv":"team","user":"ana","on":true})", &error);
    QVERIFY2(in, qPrintable(error));
    const TypingPush &tp = std::get<TypingPush>(in->body);
    QCOMPARE(tp.conv, QStringLiteral("team"));
    QCOMPARE(tp.user, QStringLiteral("ana"));
    QVERIFY(tp.on);
    in = decode(R"({"t":"presence","users":[{"user":"ben","online":true,"last_seen":1765080000123},
                   {"user":"cy","online":false,"last_seen":null}],"rid":"8"})", &error);
    QVERIFY2(in, qPrintable(error));
    QCOMPARE(std::get<PresenceReply>(in->body).users,
             (QList<PresenceState>{{QStringLiteral("ben"), true, 1765080000123}, {QStringLiteral("cy"), false, 0}}));
    in = decode(R"({"t":"presence","user":"ben","online":false,"last_seen":1765080100789})", &error);
    QVERIFY2(in, qPrintable(error));
    QCOMPARE(std::get<PresencePush>(in->body).state, (PresenceState{QStringLiteral("ben"), false, 1765080100789}));
}

void TestCodec::encodes_requests_as_the_contract_spells_them_data() {
    QTest::addColumn<QByteArray>("frame");
    QTest::addColumn<QByteArray>("expected");
    QTest::newRow("hello") << encodeHello(QStringLiteral("h1"), QStringLiteral("tok"), QStringLiteral("inst"))
                           << QByteArray(R"({"install":"inst","rid":"h1","t":"hello","token":"tok"})");
    QTest::newRow("send") << encodeSend(QStringLiteral("r1"), QStringLiteral("c"), QStringLiteral("u-1"), QStringLiteral("hé"))
                          << QByteArray(R"({"body":"hé","cmid":"u-1","conv":"c","rid":"r1","t":"send"})");
    QTest::newRow("send with prev")
        << encodeSend(QStringLiteral("r1"), QStringLiteral("c"), QStringLiteral("u-2"), QStringLiteral("x"), QStringLiteral("u-1"))
        << QByteArray(R"({"body":"x","cmid":"u-2","conv":"c","prev":"u-1","rid":"r1","t":"send"})");
    QTest::newRow("sync first") << encodeSync(QStringLiteral("r2"), QStringLiteral("c"), 0, 50, std::nullopt)
                                << QByteArray(R"({"after":0,"conv":"c","limit":50,"rid":"r2","t":"sync"})");
    QTest::newRow("sync with epoch") << encodeSync(QStringLiteral("r3"), QStringLiteral("c"), 12, 100, 3)
                                     << QByteArray(R"({"after":12,"conv":"c","epoch":3,"limit":100,"rid":"r3","t":"sync"})");
    QTest::newRow("ack") << encodeAck(QStringLiteral("r4"), QStringLiteral("c"), 7)
                         << QByteArray(R"({"conv":"c","rid":"r4","seq":7,"t":"ack"})");
    QTest::newRow("read") << encodeRead(QStringLiteral("r5"), QStringLiteral("c"), 7)
                          << QByteArray(R"({"conv":"c","rid":"r5","seq":7,"t":"read"})");
    QTest::newRow("recall") << encodeRecall(QStringLiteral("r6"), QStringLiteral("c"), 3, QStringLiteral("u-2"))
                            << QByteArray(R"({"cmid":"u-2","conv":"c","rid":"r6","t":"recall","target":3})");
    QTest::newRow("convs") << encodeConvs(QStringLiteral("r7")) << QByteArray(R"({"rid":"r7","t":"convs"})");
    QTest::newRow("refresh") << encodeRefresh(QStringLiteral("r8"), QStringLiteral("a.b.c"))
                             << QByteArray(R"({"rid":"r8","t":"refresh","token":"a.b.c"})");
    QTest::newRow("fetch") << encodeFetch(QStringLiteral("r8"), QStringLiteral("c"), 2)
                           << QByteArray(R"({"conv":"c","rid":"r8","seq":2,"t":"fetch"})");
    QTest::newRow("sub") << encodeSub(QStringLiteral("r9")) << QByteArray(R"({"rid":"r9","t":"sub"})");
    QTest::newRow("send with reply_to")
        << encodeSend(QStringLiteral("s9"), QStringLiteral("c"), QStringLiteral("u-3"), QStringLiteral("yes"), {}, 3)
        << QByteArray(R"({"body":"yes","cmid":"u-3","conv":"c","reply_to":3,"rid":"s9","t":"send"})");
    QTest::newRow("edit") << encodeEdit(QStringLiteral("e1"), QStringLiteral("c"), 9, QStringLiteral("u-4"), QStringLiteral("yes!"))
                          << QByteArray(R"({"body":"yes!","cmid":"u-4","conv":"c","rid":"e1","t":"edit","target":9})");
    QTest::newRow("react") << encodeReact(QStringLiteral("x1"), QStringLiteral("c"), 9, QStringLiteral("u-5"), QStringLiteral("ok"), false)
                           << QByteArray(R"({"cmid":"u-5","conv":"c","emoji":"ok","on":false,"rid":"x1","t":"react","target":9})");
    QTest::newRow("typing on") << encodeTyping(QStringLiteral("7"), QStringLiteral("team"), true)
                               << QByteArray(R"({"t":"typing","conv":"team","on":true,"rid":"7"})");
    QTest::newRow("typing off") << encodeTyping(QStringLiteral("8"), QStringLiteral("team"), false)
                                << QByteArray(R"({"t":"typing","conv":"team","on":false,"rid":"8"})");
    QTest::newRow("presence") << encodePresence(QStringLiteral("8"), {QStringLiteral("ben"), QStringLiteral("cy"), QStringLiteral("zed")})
                              << QByteArray(R"({"t":"presence","users":["ben","cy","zed"],"rid":"8"})");
}

void TestCodec::encodes_requests_as_the_contract_spells_them() {
    QFETCH(QByteArray, frame);
    QFETCH(QByteArray, expected);
    // Compare as JSON objects (key order is not part of the contract).
    QCOMPARE(QJsonDocument::fromJson(frame).object(), QJsonDocument::fromJson(expected).object());
    QVERIFY(frame.size() <= 64 * 1024);
}

void TestCodec::only_unavailable_and_no_reply_are_retryable_data() {
    QTest::addColumn<QByteArray>("frame"); // empty = no reply
    QTest::addColumn<int>("disposition");
    const int S = int(Disposition::Success), T = int(Disposition::Terminal), R = int(Disposition::Retry),
              E = int(Disposition::EndSession);
    QTest::newRow("no reply") << QByteArray() << R;
    QTest::newRow("sent") << QByteArray(R"({"t":"sent","rid":"r","conv":"c","seq":1,"mid":"m","dup":false})") << S;
    QTest::newRow("sent dup") << QByteArray(R"({"t":"sent","rid":"r","conv":"c","seq":1,"mid":"m","dup":true})") << S;
    QTest::newRow("UNAVAILABLE") << QByteArray(R"({"t":"error","rid":"r","code":"UNAVAILABLE"})") << R;
    QTest::newRow("edited") << QByteArray(R"({"t":"edited","rid":"r","conv":"c","seq":4,"dup":false,"epoch":1})") << S;
    QTest::newRow("reacted") << QByteArray(R"({"t":"reacted","rid":"r","conv":"c","seq":null,"dup":false,"changed":false,"epoch":1})") << S;
    for (const char *code : {"INVALID_ARGUMENT", "NOT_MEMBER", "IDEMPOTENCY_MISMATCH",
                             "ORIGINAL_EXPIRED", "NOT_SENDER", "ALREADY_RECALLED", "RECALL_WINDOW_EXPIRED",
                             "NOT_FOUND", "CURSOR_AHEAD", "EPOCH_CHANGED", "SOME_FUTURE_CODE", "EDIT_WINDOW_EXPIRED"})
        QTest::newRow(code) << (QByteArray(R"({"t":"error","rid":"r","code":")") + code + "\"}") << T;
    // Verdicts on the session, not on the request (issue 26 item 7): the
    // outbox keeps the entry and the session ends; classify() says so, no
    // caller overrides it.
    for (const char *code : {"UNAUTHENTICATED", "STALE_INSTALL"})
        QTest::newRow(code) << (QByteArray(R"({"t":"error","rid":"r","code":")") + code + "\"}") << E;
}

void TestCodec::only_unavailable_and_no_reply_are_retryable() {
    QFETCH(QByteArray, frame);
    QFETCH(int, disposition);
    std::optional<Incoming> in;
    if (!frame.isEmpty()) {
        QString error;
        in = decode(frame, &error);
        QVERIFY2(in, qPrintable(error));
    }
    QCOMPARE(int(classify(in)), disposition);
}

// Obligation 14: the SDK reads `exp` from a JWT (unverified) to ask early.
void TestCodec::reads_exp_from_a_jwt_and_nothing_from_other_tokens() {
    auto b64 = [](const char *json) {
        return QString::fromLatin1(QByteArray(json).toBase64(QByteArray::Base64UrlEncoding | QByteArray::OmitTrailingEquals));
    };
    const QString header = b64(R"({"alg":"HS256","typ":"JWT"})");
    const QString jwt = header + QLatin1Char('.') + b64(R"({"sub":"ana","device":"d1","exp":1732870060})") + QStringLiteral(".c2ln");
    QVERIFY(isJwt(jwt));
    QCOMPARE(jwtExpiryMs(jwt), std::optional<qint64>(1732870060000));
    QVERIFY(!isJwt(QStringLiteral("tok-ana")));
    QCOMPARE(jwtExpiryMs(QStringLiteral("tok-ana")), std::nullopt);
    QCOMPARE(jwtExpiryMs(header + QLatin1Char('.') + b64(R"({"sub":"ana"})") + QStringLiteral(".c2ln")), std::nullopt);        // no exp
    QCOMPARE(jwtExpiryMs(header + QLatin1Char('.') + b64(R"({"exp":"soon"})") + QStringLiteral(".c2ln")), std::nullopt);      // not a number
    QCOMPARE(jwtExpiryMs(header + QStringLiteral(".not base64!.c2ln")), std::nullopt);
}

// Obligation 3's backoff, drawn directly (tst_client's timing test cannot
// tell a jittered delay from a fixed one under a scheduler's noise): each
// draw lies in [d/2, d] with d = min(cap, initial * 2^(attempt-1)), and the
// draws spread over that range. With 1,000 uniform draws, missing either end
// by more than a tenth of the range has odds below 1e-45.
void TestCodec::retry_backoff_doubles_to_its_cap_with_jitter_over_the_upper_half() {
    const im::detail::Backoff backoff{100, 400};
    for (int attempt : {1, 2, 3, 4, 10, 1000}) {
        const int d = std::min(400, 100 << std::min(attempt - 1, 3));
        int lo = d, hi = 0;
        for (int i = 0; i < 1000; ++i) {
            const int ms = backoff.delayMs(attempt);
            QVERIFY2(ms >= d / 2 && ms <= d, qPrintable(QStringLiteral("attempt %1: %2 ms").arg(attempt).arg(ms)));
            lo = std::min(lo, ms);
            hi = std::max(hi, ms);
        }
        QVERIFY2(lo <= d / 2 + d / 20 && hi >= d - d / 20,
                 qPrintable(QStringLiteral("attempt %1: draws only in [%2, %3] of [%4, %5]")
                                .arg(attempt).arg(lo).arg(hi).arg(d / 2).arg(d)));
    }
}

QTEST_GUILESS_MAIN(TestCodec)
#include "tst_codec.moc"

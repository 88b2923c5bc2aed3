// Obligation 17, the sending side: files ride the durable outbox. Against
// the real server (its HTTP uploads, PostgreSQL chunks or --attachments-dir)
// and a real SQLite store: sendFile() copies and commits before it returns,
// the upload resumes from the server's offset after a dropped socket, a
// restart and SIGKILL, cancel() removes the server's upload, bad input never
// enters the outbox, and every path ends in exactly one message with exactly
// one attachment whose bytes match.
#include "exerelative.h"
#include "realclient.h"
#include "realserver.h"
#include "sdktestutil.h"

#include "client_p.h" // white-box: the uploader's byte count, the socket drop, the att_id

#include <im/client.h>
#include <im/testing.h>

#include <QtCore/QCryptographicHash>
#include <QtCore/QDir>
#include <QtCore/QRandomGenerator>
#include <QtCore/QTemporaryDir>
#include <QtNetwork/QNetworkAccessManager>
#include <QtNetwork/QNetworkReply>
#include <QtTest/QSignalSpy>
#include <QtTest/QtTest>

#include <algorithm>
#include <memory>

#ifndef IM_SERVER_BIN
#error "IM_SERVER_BIN must name the imserver executable"
#endif
#ifndef IM_KILLHELPER
#error "IM_KILLHELPER must name the helper executable"
#endif

using im::Client;

namespace {

const QString Conv = QStringLiteral("ana-ben");

QByteArray randomBytes(qint64 n) {
    QByteArray b(n, Qt::Uninitialized);
    QRandomGenerator *g = QRandomGenerator::global();
    for (qint64 i = 0; i + 4 <= n; i += 4) {
        const quint32 v = g->generate();
        memcpy(b.data() + i, &v, 4);
    }
    for (qint64 i = n - n % 4; i < n; ++i)
        b[i] = char(g->generate());
    return b;
}

bool writeFile(const QString &path, const QByteArray &data) {
    QFile f(path);
    return f.open(QIODevice::WriteOnly) && f.write(data) == data.size();
}

QString sha256Hex(const QByteArray &data) {
    return QString::fromLatin1(QCryptographicHash::hash(data, QCryptographicHash::Sha256).toHex());
}

} // namespace

class TestFiles : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void cleanupTestCase();
    void a_file_is_sent_once_with_its_bytes_and_later_messages_wait_behind_it();
    void bad_input_is_refused_at_once_with_nothing_in_the_outbox();
    void an_upload_resumes_from_the_server_offset_after_the_socket_drops();
    void a_restarted_client_resumes_the_same_upload();
    void cancel_removes_the_upload_from_the_server();
    // demo50: the throttle and the typed DIGEST_MISMATCH.
    void an_upload_rate_limit_paces_the_puts_without_blocking_the_thread();
    void a_chunk_corrupted_on_the_way_restarts_at_zero_and_arrives_intact();
    void a_damaged_store_copy_fails_typed_digest_mismatch_and_its_upload_is_removed();
    void killed_mid_upload_ends_in_one_message_with_one_attachment_data();
    void killed_mid_upload_ends_in_one_message_with_one_attachment();

private:
    // SQL against `server`'s database (psql), the first row's columns joined by '|'.
    static QString sql(const RealServer &server, const QString &query);
    // What the server holds for our message `cmid` in Conv: "<msgs>|<attachments>|<first att_id>".
    static QString serverMessage(const RealServer &server, const QString &cmid);
    // GET <path> on `server`'s HTTP port as `user`: status and body.
    QPair<int, QByteArray> get(const RealServer &server, const QString &user, const QString &path,
                               const QByteArray &verb = "GET");
    qint64 metric(const RealServer &server, const QString &name);
    std::unique_ptr<Client> client(const QString &db, int chunk);

    std::unique_ptr<RealServer> server_;
    QTemporaryDir dir_;
    QNetworkAccessManager http_;
};

void TestFiles::initTestCase() {
    QVERIFY(dir_.isValid());
    server_ = std::make_unique<RealServer>(exeRelativePath(IM_SERVER_BIN));
    const QString error = server_->start();
    QVERIFY2(error.isEmpty(), qPrintable(error));
}

void TestFiles::cleanupTestCase() { server_.reset(); }

QString TestFiles::sql(const RealServer &server, const QString &query) {
    QProcess p;
    p.start(QStringLiteral("psql"), {server.dbUrl(), QStringLiteral("-XtAq"), QStringLiteral("-c"), query});
    if (!p.waitForFinished(30000) || p.exitCode() != 0)
        return QStringLiteral("<psql failed: %1>").arg(QString::fromUtf8(p.readAllStandardError()));
    return QString::fromUtf8(p.readAllStandardOutput()).trimmed();
}

QString TestFiles::serverMessage(const RealServer &server, const QString &cmid) {
    return sql(server, QStringLiteral("SELECT count(DISTINCT e.seq), count(a.att_id), coalesce(min(a.att_id::text), '')"
                                      " FROM events e LEFT JOIN event_attachments a"
                                      " ON a.conv_id = e.conv_id AND a.seq = e.seq"
                                      " WHERE e.conv_id = '%1' AND e.client_msg_id = '%2'")
                           .arg(Conv, cmid));
}

QPair<int, QByteArray> TestFiles::get(const RealServer &server, const QString &user, const QString &path,
                                      const QByteArray &verb) {
    QUrl url = server.url;
    url.setScheme(QStringLiteral("http"));
    url.setPath(path);
    QNetworkRequest req(url);
    req.setRawHeader("Authorization", "Bearer " + server.tokens.value(user).toUtf8());
    std::unique_ptr<QNetworkReply> reply(http_.sendCustomRequest(req, verb));
    if (!QTest::qWaitFor([&] { return reply->isFinished(); }, 30000))
        return {-1, {}};
    return {reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt(), reply->readAll()};
}

qint64 TestFiles::metric(const RealServer &server, const QString &name) {
    const auto [code, body] = get(server, QStringLiteral("ana"), QStringLiteral("/metrics"));
    if (code != 200)
        return -1;
    const QRegularExpression line(QStringLiteral("^%1(\\{[^}]*\\})? (\\d+)").arg(name), QRegularExpression::MultilineOption);
    const QRegularExpressionMatch m = line.match(QString::fromUtf8(body));
    return m.hasMatch() ? m.captured(2).toLongLong() : -1;
}

std::unique_ptr<Client> TestFiles::client(const QString &db, int chunk) {
    auto c = makeRealClient(*server_, QStringLiteral("ana"), db);
    c->setUploadChunkSize(chunk);
    return c;
}

// sendFile() copies before it returns (the app's file is deleted at once),
// the message goes once with its attachment, the bytes at the server are
// the file's, the store's copy is gone after Sent; a text sent after the
// file in the same conversation gets the next seq (obligation 9).
void TestFiles::a_file_is_sent_once_with_its_bytes_and_later_messages_wait_behind_it() {
    const QString db = dir_.filePath(QStringLiteral("roundtrip.db"));
    auto c = client(db, 256 * 1024);
    QVERIFY(c->isOpen());
    const QByteArray data = randomBytes(3 * 1024 * 1024 + 17);
    const QString path = dir_.filePath(QStringLiteral("holiday photo.jpg"));
    QVERIFY(writeFile(path, data));
    QSignalSpy progress(c.get(), &Client::uploadProgress);
    QSignalSpy states(c.get(), &Client::messageStateChanged);

    // Written offline: the entry waits for a session (and survives).
    const QString cmid = c->sendFile(Conv, path, QStringLiteral("the photo"));
    QVERIFY2(!cmid.isEmpty(), qPrintable(c->lastError()));
    QVERIFY(QFile::remove(path)); // the app's copy may go at once
    QVERIFY(QFile::exists(db + QStringLiteral(".files/outgoing/") + cmid));
    QCOMPARE(c->pendingCount(), 1);
    QCOMPARE(c->uploadState(cmid).value(QStringLiteral("total")).toLongLong(), qint64(data.size()));
    const QString after = c->send(Conv, QStringLiteral("after the photo"));
    QVERIFY(!after.isEmpty());

    c->connectToServer();
    auto seqOf = [&](const QString &m) -> qint64 {
        for (const QList<QVariant> &s : std::as_const(states))
            if (s.at(1).toString() == m && s.at(3).value<im::MessageState>() == im::MessageState::Sent)
                return s.at(2).toLongLong();
        return 0;
    };
    QTRY_VERIFY_WITH_TIMEOUT(seqOf(cmid) > 0 && seqOf(after) > 0, 60000);
    QCOMPARE(seqOf(after), seqOf(cmid) + 1); // it waited behind the file
    QVERIFY(!progress.isEmpty());
    QCOMPARE(progress.last().at(1).toLongLong(), qint64(data.size()));
    QCOMPARE(progress.last().at(2).toLongLong(), qint64(data.size()));
    QTRY_COMPARE(c->pendingCount(), 0);
    QVERIFY(!QFile::exists(db + QStringLiteral(".files/outgoing/") + cmid));

    const QStringList row = serverMessage(*server_, cmid).split(u'|');
    QCOMPARE(row.value(0), QStringLiteral("1"));
    QCOMPARE(row.value(1), QStringLiteral("1"));
    const auto [code, bytes] = get(*server_, QStringLiteral("ben"), QStringLiteral("/v1/attachments/") + row.value(2));
    QCOMPARE(code, 200);
    QCOMPARE(bytes.size(), data.size());
    QVERIFY(bytes == data);
    QCOMPARE(sql(*server_, QStringLiteral("SELECT name || '|' || mime || '|' || size FROM uploads WHERE att_id = '%1'")
                               .arg(row.value(2))),
             QStringLiteral("holiday photo.jpg|image/jpeg|%1").arg(data.size()));
}

// Obligation 12 for files: refused at once, typed, nothing in the outbox
// nor in the store's folder.
void TestFiles::bad_input_is_refused_at_once_with_nothing_in_the_outbox() {
    const QString db = dir_.filePath(QStringLiteral("refused.db"));
    auto c = client(db, 65536);
    QVERIFY(c->isOpen());
    const QString small = dir_.filePath(QStringLiteral("small.txt"));
    QVERIFY(writeFile(small, QByteArray(1000, 'x')));
    QSignalSpy typed(c.get(), &Client::errorReported);
    struct Case { QString conv, path, body; qint64 limit; im::Error error; };
    const QList<Case> cases = {
        {Conv, dir_.filePath(QStringLiteral("no such file")), {}, 104857600, im::Error::InvalidArgument},
        {Conv, QString(), {}, 104857600, im::Error::InvalidArgument},
        {Conv, dir_.path(), {}, 104857600, im::Error::InvalidArgument}, // a directory
        {QString(), small, {}, 104857600, im::Error::InvalidArgument},  // no conversation
        {Conv, small, QString(4001, u'b'), 104857600, im::Error::InvalidArgument}, // body too long
        {Conv, small, {}, 999, im::Error::TooLarge},
    };
    for (const Case &k : cases) {
        c->setMaxFileSize(k.limit);
        typed.clear();
        QVERIFY(c->sendFile(k.conv, k.path, k.body).isEmpty());
        QCOMPARE(typed.size(), 1);
        QCOMPARE(typed.at(0).at(0).value<im::Error>(), k.error);
        QVERIFY(!c->lastError().isEmpty());
    }
    QCOMPARE(c->pendingCount(), 0);
    QVERIFY(c->outbox().isEmpty());
    QCOMPARE(QDir(db + QStringLiteral(".files/outgoing")).entryList(QDir::Files | QDir::Hidden).size(), 0);
    // At the limit it is taken (the limit is inclusive), with an empty body.
    c->setMaxFileSize(1000);
    QVERIFY(!c->sendFile(Conv, small).isEmpty());
    QCOMPARE(c->pendingCount(), 1);
}

// The WebSocket drops mid-upload (the session ends: the upload stops); after
// the reconnect the upload goes on from where the server stands: at most one
// chunk is sent twice, and no byte is committed twice.
void TestFiles::an_upload_resumes_from_the_server_offset_after_the_socket_drops() {
    const QString db = dir_.filePath(QStringLiteral("drop.db"));
    const int chunk = 256 * 1024;
    auto c = client(db, chunk);
    QVERIFY(c->isOpen());
    const QByteArray data = randomBytes(6 * 1024 * 1024);
    const QString path = dir_.filePath(QStringLiteral("drop.bin"));
    QVERIFY(writeFile(path, data));
    im::ClientPrivate *d = im::ClientPrivate::get(c.get());
    const qint64 committedBefore = metric(*server_, QStringLiteral("im_attachment_bytes_in_total"));
    QVERIFY(committedBefore >= 0);

    bool dropped = false;
    connect(c.get(), &Client::uploadProgress, c.get(), [&](const QString &, qint64 sent, qint64) {
        if (!dropped && sent >= 2 * 1024 * 1024 + chunk / 2) {
            dropped = true;
            QMetaObject::invokeMethod(c.get(), [d] { d->conn.closeSocketNow(); }, Qt::QueuedConnection);
        }
    });
    QSignalSpy states(c.get(), &Client::messageStateChanged);
    QSignalSpy connection(c.get(), &Client::connectionStateChanged);
    c->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(c->connectionState() == im::ConnectionState::Connected, 30000);
    const QString cmid = c->sendFile(Conv, path, QStringLiteral("dropped midway"));
    QVERIFY(!cmid.isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(!states.isEmpty() && states.last().at(3).value<im::MessageState>() == im::MessageState::Sent,
                             60000);
    QVERIFY(dropped);
    int reconnects = 0;
    for (const QList<QVariant> &s : std::as_const(connection))
        reconnects += s.at(0).value<im::ConnectionState>() == im::ConnectionState::Connected ? 1 : 0;
    QVERIFY2(reconnects >= 2, "the socket never dropped");
    // Resumed, not restarted: what went out is the file plus at most one chunk.
    QVERIFY2(d->outbox.uploader().bytesPut() <= data.size() + chunk,
             qPrintable(QStringLiteral("%1 bytes put for a file of %2").arg(d->outbox.uploader().bytesPut()).arg(data.size())));
    const qint64 committed = metric(*server_, QStringLiteral("im_attachment_bytes_in_total")) - committedBefore;
    QCOMPARE(committed, qint64(data.size()));
    const QStringList row = serverMessage(*server_, states.last().at(1).toString()).split(u'|');
    QCOMPARE(row.mid(0, 2), (QStringList{QStringLiteral("1"), QStringLiteral("1")}));
    QVERIFY(get(*server_, QStringLiteral("ana"), QStringLiteral("/v1/attachments/") + row.value(2)).second == data);
}

// The client is destroyed mid-upload and a new one opens the store: it
// resumes the same upload (att_id kept in the store) from the server's
// offset, and the message goes once.
void TestFiles::a_restarted_client_resumes_the_same_upload() {
    const QString db = dir_.filePath(QStringLiteral("restart.db"));
    const int chunk = 256 * 1024;
    const QByteArray data = randomBytes(6 * 1024 * 1024);
    const QString path = dir_.filePath(QStringLiteral("restart.bin"));
    QVERIFY(writeFile(path, data));
    QString cmid, attId;
    {
        auto c = client(db, chunk);
        QVERIFY(c->isOpen());
        qint64 seen = 0;
        connect(c.get(), &Client::uploadProgress, c.get(), [&](const QString &, qint64 sent, qint64) { seen = sent; });
        c->connectToServer();
        QTRY_VERIFY_WITH_TIMEOUT(c->connectionState() == im::ConnectionState::Connected, 30000);
        cmid = c->sendFile(Conv, path);
        QVERIFY(!cmid.isEmpty());
        QTRY_VERIFY_WITH_TIMEOUT(seen >= 3 * 1024 * 1024, 60000);
        attId = im::ClientPrivate::get(c.get())->outbox.findCmid(cmid)->row.file->attId;
        QVERIFY(!attId.isEmpty());
    } // gone mid-upload, as a quit app
    const QStringList before = sql(*server_, QStringLiteral("SELECT received FROM uploads WHERE att_id = '%1'").arg(attId))
                                   .split(u'|');
    const qint64 atServer = before.value(0).toLongLong();
    QVERIFY2(atServer > 0 && atServer < data.size(), qPrintable(before.join(u',')));

    auto c = client(db, chunk);
    QVERIFY(c->isOpen());
    QCOMPARE(c->pendingCount(), 1);
    QSignalSpy states(c.get(), &Client::messageStateChanged);
    c->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(!states.isEmpty() && states.last().at(3).value<im::MessageState>() == im::MessageState::Sent,
                             60000);
    QCOMPARE(states.last().at(1).toString(), cmid);
    // The same upload, from the server's offset: at most one chunk again.
    QVERIFY2(im::ClientPrivate::get(c.get())->outbox.uploader().bytesPut() <= data.size() - atServer + chunk,
             qPrintable(QStringLiteral("%1 bytes put; the server had %2 of %3")
                            .arg(im::ClientPrivate::get(c.get())->outbox.uploader().bytesPut())
                            .arg(atServer)
                            .arg(data.size())));
    QCOMPARE(serverMessage(*server_, cmid), QStringLiteral("1|1|") + attId);
    QVERIFY(get(*server_, QStringLiteral("ana"), QStringLiteral("/v1/attachments/") + attId).second == data);
}

// cancel() of a file's entry while it uploads: the entry, the store's copy
// and the server's upload go (GET /v1/uploads/{id}: 404), nothing is sent.
void TestFiles::cancel_removes_the_upload_from_the_server() {
    const QString db = dir_.filePath(QStringLiteral("cancel.db"));
    auto c = client(db, 65536);
    QVERIFY(c->isOpen());
    const QByteArray data = randomBytes(8 * 1024 * 1024);
    const QString path = dir_.filePath(QStringLiteral("cancel.bin"));
    QVERIFY(writeFile(path, data));
    qint64 seen = 0;
    connect(c.get(), &Client::uploadProgress, c.get(), [&](const QString &, qint64 sent, qint64) { seen = sent; });
    c->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(c->connectionState() == im::ConnectionState::Connected, 30000);
    const QString cmid = c->sendFile(Conv, path);
    QVERIFY(!cmid.isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(seen > 0, 60000);
    const QString attId = im::ClientPrivate::get(c.get())->outbox.findCmid(cmid)->row.file->attId;
    QVERIFY(!attId.isEmpty());
    QCOMPARE(get(*server_, QStringLiteral("ana"), QStringLiteral("/v1/uploads/") + attId).first, 200);

    QVERIFY2(c->cancel(cmid), qPrintable(c->lastError()));
    QCOMPARE(c->pendingCount(), 0);
    QVERIFY(!QFile::exists(db + QStringLiteral(".files/outgoing/") + cmid));
    QTRY_COMPARE_WITH_TIMEOUT(get(*server_, QStringLiteral("ana"), QStringLiteral("/v1/uploads/") + attId).first, 404,
                              20000);
    QCOMPARE(serverMessage(*server_, cmid), QStringLiteral("0|0|"));
}

// uploadRateLimit: the PUTs are paced to the rate on the client's thread.
// No timed upper bound anywhere (a slow machine only makes it slower): the
// whole upload takes at least the paced time (its bytes but the last
// piece's over the rate), no progress report is ahead of the rate by more
// than one piece, the pieces are a quarter second's worth, and the thread's
// event loop kept running meanwhile (a timer on it ticked).
void TestFiles::an_upload_rate_limit_paces_the_puts_without_blocking_the_thread() {
    const QString db = dir_.filePath(QStringLiteral("throttle.db"));
    auto c = client(db, 256 * 1024);
    QVERIFY(c->isOpen());
    QCOMPARE(c->uploadRateLimit(), qint64(0)); // the default: unlimited
    QSignalSpy settings(c.get(), &Client::settingsChanged);
    c->setUploadRateLimit(-5);
    QCOMPARE(c->uploadRateLimit(), qint64(0));
    QCOMPARE(settings.size(), 0); // no change
    const qint64 rate = 256 * 1024;
    QVERIFY(c->setProperty("uploadRateLimit", rate)); // the property, as QML sets it
    QCOMPARE(c->uploadRateLimit(), rate);
    QCOMPARE(settings.size(), 1);
    const qint64 piece = rate / 4; // a quarter second's worth

    const QByteArray data = randomBytes(1024 * 1024 + 100);
    const QString path = dir_.filePath(QStringLiteral("throttled.bin"));
    QVERIFY(writeFile(path, data));
    c->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(c->connectionState() == im::ConnectionState::Connected, 30000);
    QSignalSpy states(c.get(), &Client::messageStateChanged);
    QElapsedTimer clock;
    QList<QPair<qint64, qint64>> reports; // (ms since sendFile, bytes sent)
    connect(c.get(), &Client::uploadProgress, c.get(),
            [&](const QString &, qint64 sent, qint64) { reports.append({clock.elapsed(), sent}); });
    int ticks = 0;
    QTimer tick;
    connect(&tick, &QTimer::timeout, &tick, [&] { ++ticks; });
    tick.start(100);
    clock.start();
    const QString cmid = c->sendFile(Conv, path, QStringLiteral("throttled"));
    QVERIFY(!cmid.isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(!states.isEmpty() && states.last().at(3).value<im::MessageState>() == im::MessageState::Sent,
                             60000);
    const qint64 took = clock.elapsed();
    tick.stop();
    const qint64 paced = (data.size() - piece) * 1000 / rate; // every piece but the last waited for the rate
    QVERIFY2(took >= paced, qPrintable(QStringLiteral("%1 ms for %2 bytes at %3 B/s: the rate allows no less than %4 ms")
                                           .arg(took).arg(data.size()).arg(rate).arg(paced)));
    for (const auto &[ms, sent] : std::as_const(reports))
        QVERIFY2(sent <= rate * ms / 1000 + piece,
                 qPrintable(QStringLiteral("%1 bytes after %2 ms: ahead of %3 B/s by more than a piece").arg(sent).arg(ms).arg(rate)));
    // One PUT per piece, nothing sent twice.
    QCOMPARE(im::ClientPrivate::get(c.get())->outbox.uploader().bytesPut(), qint64(data.size()));
    QCOMPARE(im::ClientPrivate::get(c.get())->outbox.uploader().pieceSize(), piece);
    QVERIFY2(ticks >= 3, qPrintable(QStringLiteral("the event loop ticked %1 times in %2 ms").arg(ticks).arg(took)));
    QCOMPARE(reports.last().second, qint64(data.size()));
    const QStringList row = serverMessage(*server_, cmid).split(u'|');
    QCOMPARE(row.mid(0, 2), (QStringList{QStringLiteral("1"), QStringLiteral("1")}));
    QVERIFY(get(*server_, QStringLiteral("ana"), QStringLiteral("/v1/attachments/") + row.value(2)).second == data);
}

// im::testing::Faults::corruptNextUploadChunk: a byte flipped on the way,
// the store's copy intact. The server answers 422 DIGEST_MISMATCH at the
// last byte; the SDK finds its copy unchanged and starts again at 0: one
// message, one attachment, the right bytes, and no DIGEST_MISMATCH reported
// to the app (it recovered).
void TestFiles::a_chunk_corrupted_on_the_way_restarts_at_zero_and_arrives_intact() {
    const QString db = dir_.filePath(QStringLiteral("wire.db"));
    auto c = client(db, 256 * 1024);
    QVERIFY(c->isOpen());
    im::testing::Faults faults(c.get());
    QSignalSpy corrupted(&faults, &im::testing::Faults::uploadChunkCorrupted);
    QSignalSpy errors(c.get(), &Client::errorReported);
    QSignalSpy states(c.get(), &Client::messageStateChanged);
    const QByteArray data = randomBytes(1024 * 1024 + 5);
    const QString path = dir_.filePath(QStringLiteral("wire.bin"));
    QVERIFY(writeFile(path, data));
    const qint64 mismatchesBefore = metric(*server_, QStringLiteral("im_attachment_digest_mismatches_total"));
    c->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(c->connectionState() == im::ConnectionState::Connected, 30000);
    faults.corruptNextUploadChunk();
    const QString cmid = c->sendFile(Conv, path, QStringLiteral("damaged on the wire"));
    QVERIFY(!cmid.isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(!states.isEmpty() && states.last().at(3).value<im::MessageState>() != im::MessageState::Pending,
                             60000);
    QCOMPARE(states.last().at(3).value<im::MessageState>(), im::MessageState::Sent);
    QCOMPARE(corrupted.size(), 1);
    QCOMPARE(corrupted.at(0).at(0).toString(), cmid);
    QCOMPARE(corrupted.at(0).at(1).toLongLong(), qint64(0)); // the first PUT
    // The server saw it (422) and the upload went again from 0.
    QCOMPARE(metric(*server_, QStringLiteral("im_attachment_digest_mismatches_total")), mismatchesBefore + 1);
    QVERIFY2(im::ClientPrivate::get(c.get())->outbox.uploader().bytesPut() >= 2 * data.size(),
             qPrintable(QStringLiteral("%1 bytes put").arg(im::ClientPrivate::get(c.get())->outbox.uploader().bytesPut())));
    for (const QList<QVariant> &e : std::as_const(errors))
        QVERIFY2(e.at(0).value<im::Error>() != im::Error::DigestMismatch, qPrintable(e.at(2).toString()));
    const QStringList row = serverMessage(*server_, cmid).split(u'|');
    QCOMPARE(row.mid(0, 2), (QStringList{QStringLiteral("1"), QStringLiteral("1")}));
    QVERIFY(get(*server_, QStringLiteral("ben"), QStringLiteral("/v1/attachments/") + row.value(2)).second == data);
}

// The store's copy is damaged on disk mid-upload (what the user attached no
// longer exists intact): the server's 422 DIGEST_MISMATCH is final. The
// message fails with the code, typed (Error::DigestMismatch), nothing is
// sent, and the server's upload is removed at once (not after 24 h).
void TestFiles::a_damaged_store_copy_fails_typed_digest_mismatch_and_its_upload_is_removed() {
    const QString db = dir_.filePath(QStringLiteral("damaged.db"));
    auto c = client(db, 256 * 1024);
    QVERIFY(c->isOpen());
    c->setUploadRateLimit(512 * 1024); // time to damage it mid-upload
    QSignalSpy errors(c.get(), &Client::errorReported);
    QSignalSpy states(c.get(), &Client::messageStateChanged);
    const QByteArray data = randomBytes(2 * 1024 * 1024);
    const QString path = dir_.filePath(QStringLiteral("damaged.bin"));
    QVERIFY(writeFile(path, data));
    qint64 seen = 0;
    connect(c.get(), &Client::uploadProgress, c.get(), [&](const QString &, qint64 sent, qint64) { seen = sent; });
    c->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(c->connectionState() == im::ConnectionState::Connected, 30000);
    const QString cmid = c->sendFile(Conv, path, QStringLiteral("damaged on disk"));
    QVERIFY(!cmid.isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(seen > 0, 60000);
    const QString attId = im::ClientPrivate::get(c.get())->outbox.findCmid(cmid)->row.file->attId;
    QVERIFY(!attId.isEmpty());
    QVERIFY2(seen < data.size(), "the upload was over before the copy could be damaged");
    {
        // The copy's last byte (not yet sent) flips on disk.
        QFile copy(db + QStringLiteral(".files/outgoing/") + cmid);
        QVERIFY(copy.open(QIODevice::ReadWrite));
        QVERIFY(copy.seek(data.size() - 1));
        QVERIFY(copy.putChar(char(data.at(data.size() - 1) ^ 0x01)));
    }
    QTRY_VERIFY_WITH_TIMEOUT(!states.isEmpty() && states.last().at(3).value<im::MessageState>() != im::MessageState::Pending,
                             60000);
    QCOMPARE(states.last().at(1).toString(), cmid);
    QCOMPARE(states.last().at(3).value<im::MessageState>(), im::MessageState::Failed);
    QCOMPARE(states.last().at(4).toString(), QStringLiteral("DIGEST_MISMATCH"));
    bool typed = false;
    for (const QList<QVariant> &e : std::as_const(errors))
        typed = typed || (e.at(0).value<im::Error>() == im::Error::DigestMismatch && e.at(1).toString() == u"DIGEST_MISMATCH");
    QVERIFY2(typed, "no errorReported(Error::DigestMismatch, \"DIGEST_MISMATCH\")");
    QCOMPARE(im::errorFromCode(QStringLiteral("DIGEST_MISMATCH")), im::Error::DigestMismatch);
    QTRY_COMPARE(c->pendingCount(), 0);
    QVERIFY(!QFile::exists(db + QStringLiteral(".files/outgoing/") + cmid));
    QTRY_COMPARE_WITH_TIMEOUT(get(*server_, QStringLiteral("ana"), QStringLiteral("/v1/uploads/") + attId).first, 404,
                              20000);
    QCOMPARE(serverMessage(*server_, cmid), QStringLiteral("0|0|"));
}

void TestFiles::killed_mid_upload_ends_in_one_message_with_one_attachment_data() {
    QTest::addColumn<bool>("directoryStore");
    QTest::newRow("postgresql chunks") << false;
    QTest::newRow("--attachments-dir") << true;
}

// The SDK kill test (issue 50 item 4): a 20 MiB file, the sending process
// SIGKILLed at 10 random points of its upload (and once right after
// sendFile() returned), restarted on the same store each time: exactly one
// message, exactly one attachment, the bytes equal.
void TestFiles::killed_mid_upload_ends_in_one_message_with_one_attachment() {
    QFETCH(bool, directoryStore);
    std::unique_ptr<RealServer> own;
    RealServer *server = server_.get();
    QTemporaryDir blobs;
    if (directoryStore) {
        own = std::make_unique<RealServer>(exeRelativePath(IM_SERVER_BIN));
        own->serverArgs << QStringLiteral("--attachments-dir") << blobs.path();
        const QString error = own->start();
        QVERIFY2(error.isEmpty(), qPrintable(error));
        server = own.get();
    }
    const QString db = dir_.filePath(QStringLiteral("kill-%1.db").arg(directoryStore ? u"dir" : u"pg"));
    const qint64 size = 20 * 1024 * 1024;
    const QByteArray data = randomBytes(size);
    const QString path = dir_.filePath(QStringLiteral("kill-%1.bin").arg(directoryStore ? u"dir" : u"pg"));
    QVERIFY(writeFile(path, data));
    const QStringList common{QStringLiteral("--db"), db, QStringLiteral("--url"), server->url.toString(),
                             QStringLiteral("--token"), server->tokens.value(QStringLiteral("ana")),
                             QStringLiteral("--conv"), Conv, QStringLiteral("--file"), path,
                             QStringLiteral("--chunk"), QString::number(1024 * 1024)};
    // Ten random points spread over the upload (one in each tenth).
    QList<qint64> points;
    for (int i = 0; i < 10; ++i)
        points << size * i / 10 + qint64(QRandomGenerator::global()->bounded(size / 10));
    QString cmid;
    int kills = 0;
    QElapsedTimer clock;
    clock.start();
    auto run = [&](qint64 killAt, bool first) -> QString { // "" when killed / sent, else what went wrong
        QProcess p;
        p.start(exeRelativePath(IM_KILLHELPER),
                QStringList{QStringLiteral("sendfile")} + common
                    + (first ? QStringList{} : QStringList{QStringLiteral("--resume")}));
        if (!p.waitForStarted())
            return QStringLiteral("helper did not start");
        QByteArray buffer;
        bool killed = false, sent = false;
        QString failure;
        QStringList errors;
        (void)QTest::qWaitFor([&] {
            buffer += p.readAllStandardOutput();
            qsizetype nl;
            while ((nl = buffer.indexOf('\n')) >= 0) {
                const QString line = QString::fromUtf8(buffer.left(nl)).trimmed();
                buffer.remove(0, nl + 1);
                if (line.startsWith(u"CMID ") || line.startsWith(u"RESUME ")) {
                    const QString got = line.section(u' ', 1);
                    if (cmid.isEmpty())
                        cmid = got;
                    else if (got != cmid)
                        failure = QStringLiteral("another cmid: %1").arg(got);
                    if (first && killAt == 0) {
                        p.kill(); // right after sendFile() returned
                        killed = true;
                    }
                } else if (line.startsWith(u"PROGRESS ") && killAt > 0 && line.section(u' ', 1, 1).toLongLong() >= killAt) {
                    p.kill();
                    killed = true;
                } else if (line.startsWith(u"SENT ") || line == u"EMPTY") {
                    sent = true;
                } else if (line.startsWith(u"FAILED") || line.startsWith(u"TIMEOUT")) {
                    failure = line;
                } else if (line.startsWith(u"ERROR")) {
                    errors << line; // reported along the way (a dropped request...): not a verdict
                }
            }
            return killed || sent || !failure.isEmpty() || p.state() == QProcess::NotRunning;
        }, 60000);
        if (!killed && p.state() != QProcess::NotRunning)
            p.kill();
        finished(p);
        if (!failure.isEmpty())
            return failure + QLatin1Char(' ') + errors.join(u';') + QLatin1Char('\n')
                + QString::fromUtf8(p.readAllStandardError()).right(4000);
        if (killed) {
            ++kills;
            return {};
        }
        return sent ? QString()
                    : QStringLiteral("neither killed nor sent (exit %1; %2; %3)")
                          .arg(p.exitCode())
                          .arg(errors.join(u';'), QString::fromUtf8(buffer + p.readAllStandardError()).right(3000));
    };
    QCOMPARE(run(0, true), QString());
    for (const qint64 at : std::as_const(points))
        QCOMPARE(run(at, false), QString()); // (a point already passed: it runs to SENT, then the next ones resume nothing)
    QCOMPARE(run(-1, false), QString()); // to the end
    qInfo("%d kills, %lld ms", kills, clock.elapsed());
    QVERIFY2(kills >= 10, qPrintable(QString::number(kills)));
    QVERIFY(!cmid.isEmpty());
    const QStringList row = serverMessage(*server, cmid).split(u'|');
    QCOMPARE(row.mid(0, 2), (QStringList{QStringLiteral("1"), QStringLiteral("1")}));
    const auto [code, bytes] = get(*server, QStringLiteral("ben"), QStringLiteral("/v1/attachments/") + row.value(2));
    QCOMPARE(code, 200);
    QCOMPARE(sha256Hex(bytes), sha256Hex(data));
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox")).toInt(), 0);
}

QTEST_GUILESS_MAIN(TestFiles)
#include "tst_files.moc"

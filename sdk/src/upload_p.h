// Uploader: the HTTP side of files (obligation 17; server.md "Attachments").
// The only code in the SDK that speaks HTTP for uploads: one upload at a
// time, on the client's thread, with QNetworkAccessManager (nothing blocks),
// to the host and port of the WebSocket's current URL (ws -> http, wss ->
// https, the same trusted CAs and pin as the socket), authorised with the
// token the session runs on (Authorization: Bearer).
//
// One upload, from the store's copy of the file:
//   no att_id yet  -> POST /v1/uploads {name, mime, size, sha256}; the
//                     att_id is committed to the store (outbox_files) before
//                     the first PUT, so a restart resumes that same upload
//   att_id known   -> GET /v1/uploads/{id}: where the server stands, unless
//                     this process just learnt it from a PUT's answer
//   PUT /v1/uploads/{id}?offset=N with at most chunkSize bytes read from the
//   copy at N (never the whole file in memory), until the server says complete;
//   with a rate limit (setRateLimit) smaller PUTs, each waiting on a timer
//   until the bytes before it fit the rate
// Answers: 409 OFFSET_MISMATCH -> go on from the server's offset; 404 (the
// upload was collected) -> a new upload (POST); 422 DIGEST_MISMATCH -> the
// copy is hashed again (on a thread of its own): unchanged, the upload starts again at 0 (at most 3
// times), changed (the store's copy was damaged) -> the message fails with
// DIGEST_MISMATCH (and the server's upload is removed, as after every
// verdict); 400 / 413 -> fails (INVALID_ARGUMENT / TOO_LARGE; a
// PUT's 413 is first taken as "the server stands elsewhere": GET, up to 3
// times in a row, since our PUTs never pass the declared size); any
// other answer, a network error or a lost session -> retried after the
// backoff from GET (where the server stands).
//
// Layering: below Outbox (it drives this), above Connection's transport (it
// reads the URL, the TLS trust and the token) and Storage (att_id, complete).
#pragma once

#include "shared_p.h"
#include "storage_p.h"

#include <QtCore/QElapsedTimer>
#include <QtCore/QFile>
#include <QtCore/QObject>
#include <QtCore/QPointer>
#include <QtCore/QTimer>
#include <QtCore/QUrl>

class QNetworkAccessManager;
class QNetworkReply;

namespace im {

class Connection;

class Uploader : public QObject {
    Q_OBJECT
public:
    Uploader(detail::Storage &storage, Connection &conn, detail::Reporter &reporter, const detail::Backoff &backoff,
             QObject *parent = nullptr);
    ~Uploader() override;

    /// Starts (or resumes) the upload of send `cmid`'s file. Ignored while
    /// another upload runs (busy()).
    void start(const QString &cmid, const detail::OutboxFile &file);
    /// Ends the running upload (if it is `cmid`'s, or any when empty) without
    /// a verdict: it resumes from the server's offset when started again.
    void stop(const QString &cmid = QString());
    bool busy() const { return !cmid_.isEmpty(); }
    QString current() const { return cmid_; }
    /// Asks the server to drop upload `attId` (cancel). Best effort: without
    /// a session, or on an error, the server's collector removes it (24 h).
    void remove(const QString &attId);

    /// Bytes of PUT bodies handed to the network so far (tests: a resume
    /// re-sends at most one chunk).
    qint64 bytesPut() const { return bytesPut_; }
    int chunkSize = 4 * 1024 * 1024; ///< bytes per PUT (the server takes at most 8 MiB)

    /// The upload throttle (Client::uploadRateLimit): at most `bytesPerSecond`
    /// bytes of PUT bodies a second, 0 = unlimited. Paced, not blocking: the
    /// PUTs get smaller (a quarter second's worth, at least 4 KiB, at most
    /// chunkSize) and each waits on a timer until the bytes before it fit
    /// the rate. A change applies from the next PUT.
    void setRateLimit(qint64 bytesPerSecond);
    qint64 rateLimit() const { return rateLimit_; }
    /// The bytes of the next PUT body (what put() sends from `offset`).
    qint64 pieceSize() const;

    /// QA (im::testing::Faults::corruptNextUploadChunk): one byte of the next
    /// PUT body is flipped on its way out; the store's copy stays intact.
    /// The server's check at the last byte answers 422 DIGEST_MISMATCH and
    /// the upload starts again at 0 (a byte damaged on the way).
    void corruptNextChunk() { corruptNext_ = true; }

Q_SIGNALS:
    /// `sent` of `total` bytes of `cmid`'s file are at the server (or on their way).
    void progress(const QString &cmid, qint64 sent, qint64 total);
    /// The upload's att_id is known and committed (or cleared: a new upload).
    void attIdChanged(const QString &cmid, const QString &attId);
    /// The server has every byte, digest checked (committed to the store).
    void completed(const QString &cmid, const QString &attId);
    /// A verdict: this file can never be sent (`code`: TOO_LARGE,
    /// INVALID_ARGUMENT, DIGEST_MISMATCH, STORAGE_ERROR...). The server's
    /// upload, if it had one, is removed (DELETE, best effort).
    void failed(const QString &cmid, const QString &code, const QString &message);
    /// QA: corruptNextChunk() flipped a byte of the PUT at `offset`.
    void chunkCorrupted(const QString &cmid, qint64 offset);
    /// Nothing runs any more (done, failed, stopped or waiting for a retry
    /// that the outbox will start): the outbox may pick the next one.
    void idle();

private:
    QUrl endpoint(const QString &path) const;
    QNetworkReply *send(const QByteArray &verb, const QUrl &url, const QByteArray &body, const QByteArray &type);
    void post();
    void status();
    void put(qint64 offset); // waits on paceTimer_ first while the rate limit says so
    void onPost(QNetworkReply *reply);
    void onStatus(QNetworkReply *reply);
    void onPut(QNetworkReply *reply, qint64 offset, qint64 length);
    void onRehashed(const QString &sha256); // the copy's SHA-256 after a 422, hashed off the thread
    bool setAttId(const QString &attId); // false: not recorded (a retry is armed)
    void complete();
    void fail(const QString &code, const QString &message);
    void retryLater(const QString &why);
    void finish(); // the job ends here (no verdict)

    detail::Storage &storage_;
    Connection &conn_;
    detail::Reporter &reporter_;
    const detail::Backoff &backoff_;
    QNetworkAccessManager *http_ = nullptr;
    QPointer<QNetworkReply> reply_;
    QString cmid_;            // the running upload's send (empty: none)
    detail::OutboxFile file_;
    int failures_ = 0;        // in a row, for the backoff
    int digestRestarts_ = 0;
    int tooLargePuts_ = 0;    // 413 answers to PUTs in a row (see onPut)
    qint64 bytesPut_ = 0;
    QTimer retryTimer_{this};
    // The throttle: since paceClock_ started, pacedBytes_ went out; the next
    // PUT waits (paceTimer_) until pacedBytes_ / rateLimit_ seconds passed.
    qint64 rateLimit_ = 0;
    QElapsedTimer paceClock_;
    qint64 pacedBytes_ = 0;
    qint64 pacedOffset_ = -1; // the offset paceTimer_ will put from
    QTimer paceTimer_{this};
    bool corruptNext_ = false;
    quint64 run_ = 0; // which job a late answer (the rehash) belongs to: start() and finish() move it on
};

} // namespace im

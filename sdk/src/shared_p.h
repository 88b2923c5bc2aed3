// What the parts of a Client (Connection, Outbox, Sync, Markers) share,
// below all of them and above nothing but Qt: how they report errors, what
// they may read of the client's identity, and the retry backoff. Each part
// takes only the pieces it needs (see client_p.h for the layering).
#pragma once

#include <QtCore/QObject>
#include <QtCore/QString>

namespace im::detail {

/// Where the parts report to. ClientPrivate turns errorOccurred into
/// Client::errorOccurred + Client::errorReported, and lastError is what
/// Client::lastError() returns.
class Reporter : public QObject {
    Q_OBJECT
public:
    /// Human-readable reason of the last failed call (Client::lastError()).
    QString lastError;

    /// Reports `code` (a contract code, or a local one: STORAGE_ERROR, ...).
    void report(const QString &code, const QString &message) { emit errorOccurred(code, message); }
    /// lastError = `text`, and reports `code` with `message`.
    void fail(const QString &code, const QString &text, const QString &message) {
        lastError = text;
        report(code, message);
    }
    /// A local database failure: lastError = "what: storageError", reported
    /// as STORAGE_ERROR.
    void storageFailed(const QString &what, const QString &storageError) {
        lastError = QStringLiteral("%1: %2").arg(what, storageError);
        report(QStringLiteral("STORAGE_ERROR"), lastError);
    }

Q_SIGNALS:
    void errorOccurred(const QString &code, const QString &message);
};

/// The client's identity, as the parts may read it (ClientPrivate writes it).
struct Identity {
    QString userId, deviceId, installId;
    bool stale = false; ///< STALE_INSTALL: nothing goes on the wire
};

/// Capped exponential backoff with "equal jitter" for request retries:
/// min(maxMs, initialMs * 2^(attempt-1)), jittered into [d/2, d].
struct Backoff {
    int initialMs = 250;
    int maxMs = 30000;
    int delayMs(int attempt) const;
};

} // namespace im::detail

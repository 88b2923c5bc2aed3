// Sign in: pick a demo user from the token file (or paste a device token),
// and list the server URLs to use (one per line; reconnects rotate through
// them, `goaway` moves to the next).
#pragma once

#include "tokenfile.h"

#include <QtCore/QUrl>
#include <QtWidgets/QDialog>

class QLabel;
class QLineEdit;
class QListWidget;
class QPlainTextEdit;

/// What a chat window needs to run: where, who, and which local database.
struct Session {
    QList<QUrl> servers;
    QString token;
    QString user;   ///< from the token file; empty for a pasted token
    QString device; ///< from the token file; empty for a pasted token
    QString dbPath; ///< empty: the window manager picks a per-user file
    /// wss:// trust (im::Client::setTrustedCaFile): a PEM CA file whose CAs
    /// are trusted INSTEAD of the system store; empty: the system store.
    QString caFile;
    /// wss:// pin (im::Client::setPinnedCertificateSha256); empty: no pin.
    QString pinSha256;

    /// "ana" / "ana-d2" / "token 3f2a9c1e" (for titles and file names).
    QString label() const;
};

/// Checks the TLS fields of a session: the CA file is readable, the pin is
/// 64 hex digits (colons allowed). Returns an empty string or the problem.
QString checkTlsSettings(const QString &caFile, const QString &pinSha256);

/// Parses "url" lines (blank lines and spaces ignored); sets *bad to the
/// first line that is not a ws:// or wss:// URL.
QList<QUrl> parseServerList(const QString &text, QString *bad);

class SignInDialog : public QDialog {
    Q_OBJECT
public:
    /// `openDevices`: devices that already have a window (marked in the list).
    SignInDialog(const TokenFile &tokens, const QList<QUrl> &servers, const QStringList &openDevices,
                 const QString &preferUser, QWidget *parent = nullptr);

    Session session() const { return session_; }
    /// Pre-fills the database field (--db).
    void setDatabasePath(const QString &path);
    /// Pre-fills the TLS fields (--ca-file, --pin-sha256, or the opener's).
    void setTlsSettings(const QString &caFile, const QString &pinSha256);

    void accept() override;

private:
    void loadTokenFile(const QString &path);
    void fillUsers(const QString &preferUser);
    void updateNote();

    TokenFile tokens_;
    QStringList openDevices_;
    Session session_;
    QLineEdit *tokenFileEdit_;
    QListWidget *userList_;
    QLineEdit *tokenEdit_;
    QPlainTextEdit *serversEdit_;
    QLineEdit *dbEdit_;
    QLineEdit *caEdit_;
    QLineEdit *pinEdit_;
    QLabel *note_;
};

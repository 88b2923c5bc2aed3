// A throwaway certificate authority made with the openssl CLI at test time,
// shared by the SDK and demo-app TLS tests: a CA and a server certificate
// for 127.0.0.1/localhost signed by it, and the SHA-256 fingerprint of a
// certificate as `openssl x509 -fingerprint -sha256` prints it.
#pragma once

#include <QtCore/QDir>
#include <QtCore/QProcess>
#include <QtCore/QString>
#include <QtCore/QtDebug>

namespace throwawayca {

/// Runs `cmd` with sh -c; false (and the output in a warning) on failure.
inline bool sh(const QString &cmd) {
    QProcess p;
    p.setProcessChannelMode(QProcess::MergedChannels);
    p.start(QStringLiteral("sh"), {QStringLiteral("-c"), cmd});
    if (!p.waitForFinished(60000) || p.exitStatus() != QProcess::NormalExit || p.exitCode() != 0) {
        qWarning().noquote() << cmd << p.readAll();
        return false;
    }
    return true;
}

/// Writes DIR/NAME-ca.crt (the CA) and DIR/NAME.crt + DIR/NAME.key (a
/// server certificate for 127.0.0.1 and localhost signed by it). Returns
/// the CA file, or an empty string on failure.
inline QString make(const QDir &dir, const QString &name) {
    const QString p = dir.filePath(name);
    const bool ok =
        sh(QStringLiteral("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                          "-subj '/CN=%1 CA' -keyout %2-ca.key -out %2-ca.crt")
               .arg(name, p)) &&
        sh(QStringLiteral("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj '/CN=localhost' "
                          "-keyout %1.key -out %1.csr")
               .arg(p)) &&
        sh(QStringLiteral("printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > %1.ext && "
                          "openssl x509 -req -in %1.csr -CA %1-ca.crt -CAkey %1-ca.key -CAcreateserial -days 2 "
                          "-extfile %1.ext -out %1.crt")
               .arg(p));
    return ok ? p + QStringLiteral("-ca.crt") : QString();
}

/// "AB:CD:..." (32 colon-separated bytes) of a PEM certificate; empty on failure.
inline QString fingerprint(const QString &certFile) {
    QProcess p;
    p.start(QStringLiteral("openssl"), {QStringLiteral("x509"), QStringLiteral("-noout"), QStringLiteral("-fingerprint"),
                                        QStringLiteral("-sha256"), QStringLiteral("-in"), certFile});
    if (!p.waitForFinished(60000) || p.exitCode() != 0)
        return {};
    const QString out = QString::fromLatin1(p.readAllStandardOutput()).trimmed();
    return out.mid(out.indexOf(QLatin1Char('=')) + 1);
}

} // namespace throwawayca

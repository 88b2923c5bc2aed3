// The QML module against the real server: a Qt Quick Test whose test cases
// (tests/sdk/qml/tst_*.qml) create the Client and the models from QML, and
// drive the QML example (examples/qml-chat/ChatView.qml). This
// file only provides what QML cannot: an imserver with the demo data set (a
// real PostgreSQL, see realserver.h), its URL, the demo tokens, a temporary
// data folder, and the module's import path in the build tree.
#include "exe_relative.hpp"
#include "exerelative.h"
#include "realserver.h"

#include <QtCore/QCryptographicHash>
#include <QtCore/QFile>
#include <QtCore/QTemporaryDir>
#include <QtQml/QQmlContext>
#include <QtQml/QQmlEngine>
#include <QtQuickTest/quicktest.h>

#include <memory>
#include <string>

class Setup : public QObject {
    Q_OBJECT
public:
    Setup() = default;

public Q_SLOTS:
    void applicationAvailable() {
        server_ = std::make_unique<RealServer>(exeRelativePath(IM_SERVER_BIN));
        error_ = server_->start();
        if (error_.isEmpty() && !data_.isValid())
            error_ = QStringLiteral("no temporary data folder");
        // A file for the QML file test (QML cannot write one): 1.5 MiB of a
        // pattern, its SHA-256 for the attachments role.
        QByteArray bytes(1536 * 1024, Qt::Uninitialized);
        for (qsizetype i = 0; i < bytes.size(); ++i)
            bytes[i] = char((i * 131) ^ (i >> 11));
        file_ = data_.filePath(QStringLiteral("qml-file.bin"));
        QFile f(file_);
        if (error_.isEmpty() && (!f.open(QIODevice::WriteOnly) || f.write(bytes) != bytes.size()))
            error_ = QStringLiteral("cannot write %1").arg(file_);
        fileSha256_ = QString::fromLatin1(QCryptographicHash::hash(bytes, QCryptographicHash::Sha256).toHex());
        fileSize_ = bytes.size();
    }

    void qmlEngineAvailable(QQmlEngine *engine) {
        engine->addImportPath(exeRelativePath(IM_QML_IMPORT_DIR));
        QVariantMap tokens;
        for (auto it = server_->tokens.cbegin(); it != server_->tokens.cend(); ++it)
            tokens.insert(it.key(), it.value());
        QQmlContext *ctx = engine->rootContext();
        ctx->setContextProperty(QStringLiteral("setupError"), error_);
        ctx->setContextProperty(QStringLiteral("serverUrl"), server_->url);
        ctx->setContextProperty(QStringLiteral("tokens"), tokens);
        ctx->setContextProperty(QStringLiteral("dataDir"), data_.path());
        ctx->setContextProperty(QStringLiteral("fileToSend"), file_);
        ctx->setContextProperty(QStringLiteral("fileSha256"), fileSha256_);
        ctx->setContextProperty(QStringLiteral("fileSize"), fileSize_);
        ctx->setContextProperty(QStringLiteral("exampleDir"),
                                QUrl::fromLocalFile(exeRelativePath(IM_QML_EXAMPLE_DIR)).toString());
    }

    void cleanupTestCase() { server_.reset(); } // SIGTERM: drain, stop PostgreSQL

private:
    std::unique_ptr<RealServer> server_;
    QTemporaryDir data_;
    QString error_;
    QString file_, fileSha256_;
    qint64 fileSize_ = 0;
};

// QUICK_TEST_MAIN_WITH_SETUP(tst_qml, Setup), but with the test cases'
// folder (tests/sdk/qml) compiled in relative to this executable
// (IM_QML_TESTS_DIR) instead of as QUICK_TEST_SOURCE_DIR, an absolute path.
// It is resolved before quick_test_main creates the application, hence
// /proc/self/exe rather than applicationDirPath().
int main(int argc, char **argv) {
    Setup setup;
    const std::string tests = im::test::exe_relative(IM_QML_TESTS_DIR);
    return quick_test_main_with_setup(argc, argv, "tst_qml", tests.c_str(), &setup);
}

#include "tst_qml.moc"

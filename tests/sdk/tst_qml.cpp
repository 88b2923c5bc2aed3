// The QML module against the real server: a Qt Quick Test whose test cases
// (tests/sdk/qml/tst_*.qml) create the Client and the models from QML, and
// drive the QML example (examples/qml-chat/ChatView.qml). This
// file only provides what QML cannot: an imserver with the demo data set (a
// real PostgreSQL, see realserver.h), its URL, the demo tokens, a temporary
// data folder, and the module's import path in the build tree.
#include "realserver.h"

#include <QtCore/QTemporaryDir>
#include <QtQml/QQmlContext>
#include <QtQml/QQmlEngine>
#include <QtQuickTest/quicktest.h>

#include <memory>

class Setup : public QObject {
    Q_OBJECT
public:
    Setup() = default;

public Q_SLOTS:
    void applicationAvailable() {
        server_ = std::make_unique<RealServer>(QStringLiteral(IM_SERVER_BIN));
        error_ = server_->start();
        if (error_.isEmpty() && !data_.isValid())
            error_ = QStringLiteral("no temporary data folder");
    }

    void qmlEngineAvailable(QQmlEngine *engine) {
        engine->addImportPath(QStringLiteral(IM_QML_IMPORT_DIR));
        QVariantMap tokens;
        for (auto it = server_->tokens.cbegin(); it != server_->tokens.cend(); ++it)
            tokens.insert(it.key(), it.value());
        QQmlContext *ctx = engine->rootContext();
        ctx->setContextProperty(QStringLiteral("setupError"), error_);
        ctx->setContextProperty(QStringLiteral("serverUrl"), server_->url);
        ctx->setContextProperty(QStringLiteral("tokens"), tokens);
        ctx->setContextProperty(QStringLiteral("dataDir"), data_.path());
        ctx->setContextProperty(QStringLiteral("exampleDir"),
                                QUrl::fromLocalFile(QStringLiteral(IM_QML_EXAMPLE_DIR)).toString());
    }

    void cleanupTestCase() { server_.reset(); } // SIGTERM: drain, stop PostgreSQL

private:
    std::unique_ptr<RealServer> server_;
    QTemporaryDir data_;
    QString error_;
};

QUICK_TEST_MAIN_WITH_SETUP(tst_qml, Setup)

#include "tst_qml.moc"

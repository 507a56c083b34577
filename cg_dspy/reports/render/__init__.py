"""A typed Report drawn for readers: Markdown tables (`markdown`), the paper's figures
(`plots`) and one self-contained HTML page of both (`html`)."""
